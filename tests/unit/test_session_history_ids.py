"""One history append names each message once: a command whose entries repeat a message id
is refused whole (a typed `InvalidError`) and appends nothing — before, both copies were
appended, as only ids already stored were checked."""

from __future__ import annotations

import pytest

from suzumio.contracts.commands import AppendHistory
from suzumio.contracts.commands.sessions import HistoryEntry
from suzumio.contracts.errors import InvalidError
from suzumio.contracts.events import ActivationRequested, SessionOpened
from suzumio.session.domain import session
from suzumio.session.domain.session import SessionState

AGENT, RUNNING = "a" * 26, "x" * 26
M, N = "m" * 26, "n" * 26


def live() -> SessionState:
    state = SessionState("s" * 26)
    events = (
        SessionOpened(project_id="p" * 26, agent_id=AGENT),
        ActivationRequested(activation_id=RUNNING, agent_id=AGENT, signal_ids=()),
    )
    for version, data in enumerate(events, start=1):
        state.fold(data, version, version)
    return state


def append(*entries: tuple[str, str]) -> AppendHistory:
    return AppendHistory(
        session_id="s" * 26,
        activation_id=RUNNING,
        agent_id=AGENT,
        entries=tuple(HistoryEntry(message_id=i, role="assistant", text=t) for i, t in entries),
    )


def test_entries_repeating_a_message_id_are_refused_whole() -> None:
    with pytest.raises(InvalidError, match=M):
        session.append_history(live(), append((N, "first"), (M, "one"), (M, "two")))


def test_distinct_entries_are_appended_in_order() -> None:
    written = session.append_history(live(), append((M, "one"), (N, "two")))
    assert [e.message_id for e in written] == [M, N]  # type: ignore[attr-defined]
