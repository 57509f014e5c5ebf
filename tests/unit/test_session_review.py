"""Review of the session service's domain and checks: each test is a command that went wrong
before (a 500 instead of a typed error, a limit other than the documented one, a duplicate
the read model cannot hold)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from suzumio.contracts.commands import (
    AnswerPendingAction,
    CreateAgent,
    CreateApiKey,
    CreatePendingAction,
    GrantMount,
    PostMessage,
    RecordSignal,
    RevokeMount,
)
from suzumio.contracts.errors import ConflictError, ForbiddenError, InvalidError
from suzumio.contracts.events import (
    ActivationCancelRequested,
    ApiKeyCreated,
    ApiKeyRevoked,
    MountGranted,
    MountRevoked,
    ProjectCreated,
    SessionClosed,
    SessionMessageAppended,
    SessionOpened,
    UserCreated,
)
from suzumio.contracts.values import (
    MAX_ENV_FACTS,
    Author,
    ModelSpec,
    PendingKind,
    Priority,
    SignalKind,
)
from suzumio.session.domain import agent, pending_action, project, session, user
from suzumio.session.domain.agent import AgentState
from suzumio.session.domain.pending_action import PendingActionState
from suzumio.session.domain.project import ProjectState
from suzumio.session.domain.session import SessionState
from suzumio.session.domain.user import MAX_KEYS, UserState
from suzumio.session.mounts import canonical_mount_path

P, A, S, M = "p" * 26, "a" * 26, "s" * 26, "m" * 26


def test_a_host_path_with_a_name_too_long_is_invalid_not_a_crash(tmp_path: Path) -> None:
    """`Path.is_dir` raises for ENAMETOOLONG (and EACCES) instead of answering False: the
    grant came back as an internal error (HTTP 500) for a project admin's bad input."""
    root = tmp_path.resolve()
    with pytest.raises(InvalidError, match="cannot be checked"):
        canonical_mount_path(str(root / ("x" * 300)), (root,))
    with pytest.raises(InvalidError, match="not an existing directory"):
        canonical_mount_path(str(root / "missing"), (root,))


def test_an_agent_takes_as_many_env_facts_as_the_api_and_packages_allow() -> None:
    """docs/api.md and docs/agent-packages.md (and the command's own bound) allow 1,000 env
    facts; the session service refused more than 200."""
    project = ProjectState(P)
    project.fold(ProjectCreated(name="p", owner_id="u"), 1, 1)
    facts = {f"fact{i}": "v" for i in range(MAX_ENV_FACTS)}
    create = CreateAgent(
        project_id=P,
        agent_id=A,
        name="a",
        role="r",
        model=ModelSpec(name="m"),
        env_facts=facts,
    )
    [created] = agent.create(AgentState(A), project, create)
    assert created.env_facts == facts  # type: ignore[attr-defined]


def test_a_message_id_the_session_holds_already_is_refused() -> None:
    """A second message under an id the session holds (with a fresh signal id) was appended:
    the sessions read model keys messages by (session, message id), so the projector failed
    on it and parked it; the session's history lost it."""
    state = SessionState(S)
    state.fold(SessionOpened(project_id=P, agent_id=A), 1, 1)
    author = Author(kind="agent", id=A)
    state.fold(
        SessionMessageAppended(message_id=M, author=author, role="assistant", text="hi"), 2, 2
    )
    post = PostMessage(session_id=S, message_id=M, signal_id="g" * 26, text="hello")
    with pytest.raises(ConflictError, match="exists already"):
        session.post_message(state, post, Author(kind="user", id="u"))
    fresh = PostMessage(session_id=S, message_id="n" * 26, signal_id="g" * 26, text="hello")
    assert len(session.post_message(state, fresh, Author(kind="user", id="u"))) == 2


def test_a_retry_after_the_session_closed_is_told_its_message_exists() -> None:
    """A message (or signal) recorded, then the session closed, then the sender's retry (a
    broker's `message.send` asked again): told it exists — taken as done — not that the
    session is closed, which said the first, successful, call had failed."""
    state = SessionState(S)
    state.fold(SessionOpened(project_id=P, agent_id=A), 1, 1)
    post = PostMessage(session_id=S, message_id=M, signal_id="g" * 26, text="hello")
    for version, event in enumerate(
        session.post_message(state, post, Author(kind="agent", id=A)), 2
    ):
        state.fold(event, version, version)
    state.fold(SessionClosed(), 4, 4)
    with pytest.raises(ConflictError, match="exists already"):
        session.post_message(state, post, Author(kind="agent", id=A))
    signal = RecordSignal(
        session_id=S, signal_id="g" * 26, kind=SignalKind.CUSTOM, priority=Priority.P3
    )
    with pytest.raises(ConflictError, match="exists already"):
        session.record_signal(state, signal, by_user=False)
    fresh = PostMessage(session_id=S, message_id="n" * 26, signal_id="h" * 26, text="more")
    with pytest.raises(ConflictError, match="closed"):
        session.post_message(state, fresh, Author(kind="agent", id=A))


def test_expired_keys_do_not_count_as_active_ones() -> None:
    """A user whose keys had all expired was refused a new one ("at most 100 active keys")
    though none of them opened anything any more."""
    now = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
    state = UserState("u" * 26)
    state.fold(UserCreated(name="u"), 1, 1)
    for i in range(MAX_KEYS):
        expired = now - timedelta(days=1)
        digest = "0" * 64
        state.fold(
            ApiKeyCreated(key_id=f"k{i:07}", digest=digest, expires_at=expired), i + 2, i + 2
        )
    new = CreateApiKey(user_id="u" * 26, key_id="fresh0001", digest="1" * 64)
    assert len(user.create_key(state, new, now)) == 1
    # Keys still valid count; so does one without an expiry; a naive one (from an older
    # event) is read as UTC.
    naive = (now - timedelta(hours=1)).replace(tzinfo=None)
    state.fold(ApiKeyCreated(key_id="naive0001", digest="2" * 64, expires_at=naive), 500, 500)
    for i in range(MAX_KEYS - 1):
        later = now + timedelta(days=1)
        key = ApiKeyCreated(key_id=f"v{i:07}", digest="3" * 64, expires_at=later)
        state.fold(key, 501 + i, 501 + i)
    assert len(user.create_key(state, new, now)) == 1
    state.fold(ApiKeyCreated(key_id="forever01", digest="4" * 64), 700, 700)
    with pytest.raises(ConflictError, match="active keys"):
        user.create_key(state, new, now)


def test_a_cancelled_activation_cannot_leave_the_user_a_question() -> None:
    """The broker checks the fence before it asks; a cancel stored while `/runner/ask` was on
    its way still let the question through (history appends were checked again, questions
    were not): the user was asked by an activation that was gone."""
    state = SessionState(S)
    state.fold(SessionOpened(project_id=P, agent_id=A), 1, 1)
    ask = CreatePendingAction(
        pending_action_id="q" * 26,
        session_id=S,
        activation_id="c" * 26,
        kind=PendingKind.QUESTION,
        prompt="which branch?",
    )
    now = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
    assert len(pending_action.create(PendingActionState("q" * 26), state, ask, now)) == 1
    state.fold(ActivationCancelRequested(activation_id="c" * 26, reason="P0"), 2, 2)
    with pytest.raises(ForbiddenError, match="cancelled"):
        pending_action.create(PendingActionState("q" * 26), state, ask, now)


@pytest.mark.parametrize(
    ("kind", "options", "answer", "why"),
    [
        (PendingKind.QUESTION, ("a", "b"), {"answer": ""}, "non-empty"),
        (PendingKind.QUESTION, (), {"answer": "  "}, "non-empty"),
        (PendingKind.QUESTION, (), {"answer": "x", "approved": True}, "approval only"),
        (PendingKind.QUESTION, (), {"answer": "x", "artifact_ids": ("f" * 26,)}, "request only"),
        (PendingKind.APPROVAL, (), {"approved": True, "artifact_ids": ("f" * 26,)}, "only"),
    ],
)
def test_an_answer_that_does_not_answer_its_kind_is_refused(
    kind: PendingKind, options: tuple[str, ...], answer: dict[str, object], why: str
) -> None:
    """Bad input gets a clear error: an empty answer to a question (its options' check let ""
    through), or fields the kind ignores, are 422 — not taken as answers."""
    state = SessionState(S)
    state.fold(SessionOpened(project_id=P, agent_id=A), 1, 1)
    now = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
    action = PendingActionState("q" * 26)
    ask = CreatePendingAction(
        pending_action_id="q" * 26, session_id=S, kind=kind, prompt="?", options=options
    )
    for version, event in enumerate(pending_action.create(action, state, ask, now), start=1):
        action.fold(event, version, version)
    given = AnswerPendingAction.model_validate({"pending_action_id": "q" * 26, **answer})
    with pytest.raises(InvalidError, match=why):
        pending_action.answer(action, given, "user:u", now)
    good = {"answer": "a"} if kind is PendingKind.QUESTION else {"approved": True}
    fine = AnswerPendingAction.model_validate({"pending_action_id": "q" * 26, **good})
    assert pending_action.answer(action, fine, "user:u", now)


def test_a_revoked_grants_id_cannot_grant_again() -> None:
    """A keyed grant's id comes from its idempotency key: a retry of it (its answer lost, or
    past the key's day) after an admin revoked the grant must not bring the host directory back
    — it was accepted as a new grant. Like a deleted artifact's, a revoked grant's id stays
    taken."""
    state = ProjectState(P)
    state.apply(ProjectCreated(name="p", owner_id="u"))
    grant = GrantMount(project_id=P, grant_id="g" * 26, host_path="/srv/data", target="/data")
    state.apply(project.grant_mount(state, grant, "/srv/data")[0])
    assert isinstance(
        project.revoke_mount(state, RevokeMount(project_id=P, grant_id="g" * 26))[0], MountRevoked
    )
    state.apply(MountRevoked(grant_id="g" * 26))
    with pytest.raises(ConflictError, match="revoked"):
        project.grant_mount(state, grant, "/srv/data")
    again = grant.model_copy(update={"grant_id": "h" * 26})  # a new grant of the same directory
    assert isinstance(project.grant_mount(state, again, "/srv/data")[0], MountGranted)


def test_a_key_is_usable_only_when_the_users_own_and_neither_revoked_nor_expired() -> None:
    """What the gateway asks the log while the keys' read model is frozen (`check_api_key`)."""
    now = datetime.now(UTC)
    state = UserState("u")
    state.fold(UserCreated(name="u"), 1, 1)
    state.fold(ApiKeyCreated(key_id="active01", digest="0" * 64), 2, 2)
    state.fold(ApiKeyCreated(key_id="revoked1", digest="0" * 64), 3, 3)
    state.fold(ApiKeyRevoked(key_id="revoked1"), 4, 4)
    past = now - timedelta(seconds=1)
    state.fold(ApiKeyCreated(key_id="expired1", digest="0" * 64, expires_at=past), 5, 5)
    usable = {k: user.usable(state, k, now) for k in ("active01", "revoked1", "expired1", "nokey1")}
    assert usable == {"active01": True, "revoked1": False, "expired1": False, "nokey1": False}
