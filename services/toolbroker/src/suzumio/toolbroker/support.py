"""Toolpack support operations: the stateful half of a toolpack, run by the broker.

The operation allowlist is the manifest's `support_operations`; the built-in `core` toolpack's
operations are the broker's own. An operation gets a `SupportContext` (who calls, and the
effects it may have: messages and signals, with ids derived from the call so a retry creates
nothing twice) and returns a JSON object.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from pydantic import ValidationError

from suzumio.contracts.broker import MessageSend, SignalRecord
from suzumio.contracts.commands import CommandAccepted, PostMessage, RecordSignal
from suzumio.contracts.envelope import decode_data
from suzumio.contracts.errors import ConflictError, InvalidError, NotFoundError, is_id_taken
from suzumio.contracts.events import SessionOpened
from suzumio.contracts.ids import derived_id, is_valid_id
from suzumio.contracts.toolpacks import ToolpackManifest, resolve
from suzumio.contracts.values import SignalKind
from suzumio.platform.bus.commands import CommandClient
from suzumio.platform.bus.eventstore import EventStore
from suzumio.platform.logging import get_logger
from suzumio.platform.tokens import ActivationClaims

log = get_logger(__name__)
ACTOR = "system:toolbroker"


@dataclass(frozen=True)
class SupportContext:
    claims: ActivationClaims
    toolpack: str
    operation: str
    request_id: str
    commands: CommandClient
    store: EventStore
    # Raises when the activation may no longer act (BrokerError 403 `fenced`). The call was
    # let in live, but an operation may work a while (a toolpack's own requests) before its
    # effects: a cancel or a P0 stored meanwhile must stop them, as it stops every later call.
    fence: Callable[[], Awaitable[None]] | None = None

    def derived(self, *what: str) -> str:
        return derived_id(
            "support", self.claims.activation_id, self.toolpack, self.request_id, *what
        )

    async def session_project(self, session_id: str) -> str | None:
        """The project the session was opened in (its first commit: one read, not its whole
        history, which an agent could otherwise have read again and again by messages)."""
        for envelope in await self.store.first("session", session_id):
            if envelope.type == SessionOpened.event_type:
                opened = decode_data(envelope)
                assert isinstance(opened, SessionOpened)
                return opened.project_id
        return None

    async def post_message(self, session_id: str, text: str, priority: Any) -> CommandAccepted:
        """A message to a session of the same project (another agent's, or this one)."""
        # Checked before it names a subject: a toolpack's code may pass on what the model
        # wrote, and `*` or `>` there would read every session's events.
        if not is_valid_id(session_id):
            raise NotFoundError("session not found")
        if await self.session_project(session_id) != self.claims.project_id:
            raise NotFoundError("session not found")  # another project's looks like none
        # The target is part of the ids: one call id naming two sessions must not give both
        # messages one id (the second would be taken for a retry of the first and dropped).
        message_id = self.derived("message", session_id)
        signal_id = self.derived("message.signal", session_id)
        return await self._once(
            _built(
                PostMessage,
                session_id=session_id,
                message_id=message_id,
                signal_id=signal_id,
                text=text,
                priority=priority,
                # Checked by the session on its own state, as the broker's fence cannot be
                # (a cancel stored while the call is on its way); another session's state says
                # nothing of this activation.
                activation_id=self.claims.activation_id
                if session_id == self.claims.session_id
                else None,
            ),
            f"system:agent:{self.claims.agent_id}",
            {"message_id": message_id, "signal_id": signal_id},
        )

    async def record_signal(
        self, kind: str, payload: dict[str, Any], priority: Any, not_before: datetime | None
    ) -> CommandAccepted:
        # An agent records custom work only: platform kinds (an approval's result, a file's
        # arrival) and what they carry must not be forged. Its label stays in the payload.
        clean = {k: v for k, v in payload.items() if k != "pending_action_id"}
        signal_id = self.derived("signal")
        return await self._once(
            _built(
                RecordSignal,
                session_id=self.claims.session_id,
                signal_id=signal_id,
                kind=SignalKind.CUSTOM,
                priority=priority,
                payload={**clean, "kind": kind, "toolpack": self.toolpack},
                not_before=not_before,
                activation_id=self.claims.activation_id,
            ),
            ACTOR,
            {"signal_id": signal_id},
        )

    async def _once(
        self, command: PostMessage | RecordSignal, actor: str, result: dict[str, Any]
    ) -> CommandAccepted:
        """Send a command whose ids derive from this call: a retried call finds them recorded
        already and answers as the first one did."""
        if self.fence is not None:
            await self.fence()
        try:
            try:
                return await self.commands.send(command, actor=actor)
            except InvalidError as exc:
                if command.activation_id is None or not _unknown_field(exc, "activation_id"):
                    raise
                # A session service of the release before it (mid-upgrade) knows no such
                # field: sent without, as that release did — the broker's fence alone holds.
                bare = command.model_copy(update={"activation_id": None})
                return await self.commands.send(bare, actor=actor)
        except ConflictError as exc:
            if not is_id_taken(exc):
                raise
            return CommandAccepted(result=result)


C = TypeVar("C", PostMessage, RecordSignal)


def _unknown_field(exc: InvalidError, name: str) -> bool:
    """Whether the refusal is of `name` as a field the service does not know."""
    errors = exc.details.get("errors")
    return isinstance(errors, list) and any(
        isinstance(e, dict) and e.get("loc") == name and e.get("type") == "extra_forbidden"
        for e in errors
    )


def _built(command: type[C], **fields: Any) -> C:
    """The command, or 422: what passed an operation's own checks may still not fit it — a
    payload at its limit plus the labels added here, a NUL or a bad priority from a
    toolpack's code — and that is the call's fault, not the broker's (a 500)."""
    try:
        return command(**fields)
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_input=False)
        raise InvalidError(f"invalid arguments: {errors}") from None


Operation = Callable[[SupportContext, dict[str, Any]], Awaitable[dict[str, Any]]]


M = TypeVar("M", MessageSend, SignalRecord)


def _parse(model: type[M], arguments: dict[str, Any]) -> M:
    try:
        return model.model_validate(arguments)
    except ValidationError as exc:
        raise InvalidError(f"invalid arguments: {exc.errors(include_url=False)}") from None


async def message_send(ctx: SupportContext, arguments: dict[str, Any]) -> dict[str, Any]:
    args = _parse(MessageSend, arguments)
    reply = await ctx.post_message(args.session_id, args.text, args.priority)
    return {"message_id": reply.result.get("message_id"), "session_id": args.session_id}


async def signal_record(ctx: SupportContext, arguments: dict[str, Any]) -> dict[str, Any]:
    args = _parse(SignalRecord, arguments)
    not_before = (
        datetime.now(UTC) + timedelta(seconds=args.delay_seconds) if args.delay_seconds else None
    )
    reply = await ctx.record_signal(args.kind, args.payload, args.priority, not_before)
    return {"signal_id": reply.result.get("signal_id")}


CORE_OPERATIONS: dict[str, Operation] = {
    "message.send": message_send,
    "signal.record": signal_record,
}


class SupportOperations:
    """The operations the broker may run, by toolpack: core's and the installed manifests'."""

    def __init__(self, manifests: Mapping[str, ToolpackManifest]) -> None:
        self._ops: dict[str, dict[str, Operation]] = {"core": dict(CORE_OPERATIONS)}
        for name, manifest in manifests.items():
            if name == "core":
                continue  # the broker's own: a package cannot replace them
            ops: dict[str, Operation] = {}
            for operation, ref in manifest.support_operations.items():
                try:
                    ops[operation] = resolve(ref)
                except Exception as exc:
                    log.warning(
                        "broker.operation_unloadable", toolpack=name, ref=ref, error=repr(exc)
                    )
            self._ops[name] = ops

    def find(self, toolpack: str, operation: str) -> Operation | None:
        return self._ops.get(toolpack, {}).get(operation)

    def known(self, toolpack: str) -> bool:
        return toolpack in self._ops
