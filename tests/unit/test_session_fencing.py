"""The session aggregate refuses what a cancelled activation writes to it (history,
compaction, checkpoint, the signals and messages it records for itself), on the very state
its append is conditional on: a cancel stored while the tool-broker's request was on its way
is never overtaken. Retries of what was recorded before the cancel stay harmless no-ops."""

from __future__ import annotations

import pytest

from suzumio.contracts.commands import (
    AppendHistory,
    CompactHistory,
    PostMessage,
    RecordSignal,
    SaveCheckpoint,
)
from suzumio.contracts.commands.sessions import HistoryEntry
from suzumio.contracts.envelope import DomainEvent
from suzumio.contracts.errors import ID_TAKEN, ConflictError, ForbiddenError, is_id_taken
from suzumio.contracts.events import (
    ActivationCancelRequested,
    ActivationRequested,
    SessionOpened,
)
from suzumio.contracts.values import Author
from suzumio.session.domain import session
from suzumio.session.domain.session import SessionState

AGENT, RUNNING, OTHER = "a" * 26, "x" * 26, "y" * 26


def state_after(*events: DomainEvent) -> SessionState:
    state = SessionState("s" * 26)
    for version, data in enumerate(events, start=1):
        state.fold(data, version, version)
    return state


def history(activation_id: str, *message_ids: str) -> AppendHistory:
    return AppendHistory(
        session_id="s" * 26,
        activation_id=activation_id,
        agent_id=AGENT,
        entries=tuple(HistoryEntry(message_id=m, role="assistant", text=m) for m in message_ids),
    )


def opened() -> list[DomainEvent]:
    return [
        SessionOpened(project_id="p" * 26, agent_id=AGENT),
        ActivationRequested(activation_id=RUNNING, agent_id=AGENT, signal_ids=()),
    ]


def requested(activation_id: str) -> ActivationRequested:
    return ActivationRequested(activation_id=activation_id, agent_id=AGENT, signal_ids=())


def test_a_cancelled_activation_writes_no_more_history() -> None:
    live = state_after(*opened())
    [written] = session.append_history(live, history(RUNNING, "m" * 26))
    cancelled = state_after(  # a P0 replaced it
        *opened(),
        written,
        ActivationCancelRequested(activation_id=RUNNING, reason="P0"),
        requested(OTHER),
    )
    with pytest.raises(ForbiddenError, match="cancelled"):
        session.append_history(cancelled, history(RUNNING, "n" * 26))
    # Its retry of an entry recorded before the cancel: nothing to do, no refusal.
    assert session.append_history(cancelled, history(RUNNING, "m" * 26)) == []
    # The one that replaced it is not fenced by it.
    assert len(session.append_history(cancelled, history(OTHER, "o" * 26))) == 1


def test_a_cancelled_activation_compacts_and_checkpoints_no_more() -> None:
    cancelled = state_after(*opened(), ActivationCancelRequested(activation_id=RUNNING))
    compaction = CompactHistory(
        session_id="s" * 26,
        activation_id=RUNNING,
        marker_id="k" * 26,
        summary="so far",
        archived_from="m" * 26,
        archived_through="m" * 26,
    )
    with pytest.raises(ForbiddenError):
        session.compact_history(cancelled, compaction)
    checkpoint = SaveCheckpoint(
        session_id="s" * 26, activation_id=RUNNING, checkpoint_id="c" * 26, data={"step": 1}
    )
    with pytest.raises(ForbiddenError):
        session.save_checkpoint(cancelled, checkpoint)
    live = state_after(*opened())
    assert len(session.save_checkpoint(live, checkpoint)) == 1


def test_a_later_activation_of_the_session_fences_the_one_before() -> None:
    """The scheduler requests a session's next activation only once the last one ended: one
    still writing then is an attempt whose end was recorded (failed, timed out) while its
    sandbox lived on, and its entries would land among its successor's."""
    live = state_after(*opened())
    [written] = session.append_history(live, history(RUNNING, "m" * 26))
    later = state_after(*opened(), written, requested(OTHER))
    with pytest.raises(ForbiddenError, match="later one"):
        session.append_history(later, history(RUNNING, "n" * 26))
    assert session.append_history(later, history(RUNNING, "m" * 26)) == []  # a retry
    checkpoint = SaveCheckpoint(
        session_id="s" * 26, activation_id=RUNNING, checkpoint_id="c" * 26, data={"step": 1}
    )
    with pytest.raises(ForbiddenError, match="later one"):
        session.save_checkpoint(later, checkpoint)
    assert len(session.append_history(later, history(OTHER, "o" * 26))) == 1


def test_a_cancelled_activation_queues_no_more_work_for_its_session() -> None:
    """A signal (or a message) an agent records for its own session through the tool-broker
    carries its activation: one stored after a cancel or the next request would start the
    work the user just stopped. A user's, which carries none, is not fenced."""

    def signal(signal_id: str, activation_id: str | None) -> RecordSignal:
        return RecordSignal(
            session_id="s" * 26, signal_id=signal_id, payload={"k": 1}, activation_id=activation_id
        )

    def message(message_id: str, activation_id: str | None) -> PostMessage:
        return PostMessage(
            session_id="s" * 26,
            message_id=message_id,
            signal_id=message_id[::-1],
            text="later",
            activation_id=activation_id,
        )

    agent = Author(kind="agent", id=AGENT)
    live = state_after(*opened())
    [recorded] = session.record_signal(live, signal("g" * 26, RUNNING), by_user=False)
    assert len(session.post_message(live, message("a" * 25 + "b", RUNNING), agent)) == 2

    cancelled = state_after(*opened(), recorded, ActivationCancelRequested(activation_id=RUNNING))
    with pytest.raises(ForbiddenError, match="cancelled"):
        session.record_signal(cancelled, signal("h" * 26, RUNNING), by_user=False)
    with pytest.raises(ForbiddenError, match="cancelled"):
        session.post_message(cancelled, message("a" * 25 + "c", RUNNING), agent)
    later = state_after(*opened(), recorded, requested(OTHER))
    with pytest.raises(ForbiddenError, match="later one"):
        session.record_signal(later, signal("h" * 26, RUNNING), by_user=False)
    # A retry of one recorded before the cancel is told it exists (taken as done).
    with pytest.raises(ConflictError, match="exists already") as taken:
        session.record_signal(cancelled, signal("g" * 26, RUNNING), by_user=False)
    assert is_id_taken(taken.value)
    assert taken.value.details == {"reason": ID_TAKEN}  # typed: a retry looks for it
    # Neither the activation that replaced it nor a user is fenced by it.
    assert len(session.record_signal(later, signal("i" * 26, OTHER), by_user=False)) == 1
    assert len(session.record_signal(cancelled, signal("j" * 26, None), by_user=False)) == 1
    user = Author(kind="user", id="u" * 26)
    assert len(session.post_message(cancelled, message("a" * 25 + "d", None), user)) == 2
