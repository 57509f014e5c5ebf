"""Commands over NATS request/reply: a client that returns typed results or raises typed
errors, and a server that routes `cmd.<service>.<verb>` to an explicit table of handlers."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import Error as NatsError
from nats.errors import MaxPayloadError, NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from opentelemetry.trace import SpanKind, Status, StatusCode
from pydantic import ValidationError

from suzumio.contracts.commands import (
    Command,
    CommandAccepted,
    CommandRejected,
    CommandRequest,
)
from suzumio.contracts.commands.base import REPLY_ADAPTER
from suzumio.contracts.envelope import EventMeta, NewerSchemaError, UnknownEventTypeError
from suzumio.contracts.errors import (
    CommandError,
    CommandTimeoutError,
    ErrorBody,
    ErrorCode,
    InternalError,
    InvalidError,
    UnavailableError,
)
from suzumio.contracts.subjects import Topology
from suzumio.platform import telemetry
from suzumio.platform.bus.replies import Replies
from suzumio.platform.logging import get_logger
from suzumio.platform.trouble import is_trouble

log = get_logger(__name__)

C = TypeVar("C", bound=Command)
CommandReplyModel = CommandAccepted | CommandRejected

_commands = telemetry.meter.create_counter(
    "suzumio_commands", description="commands handled, by service, verb and outcome"
)


@dataclass(frozen=True, slots=True)
class CommandContext(Generic[C]):
    """A command as a handler receives it: the typed payload and who sent it, why."""

    command: C
    request: CommandRequest

    @property
    def actor(self) -> str:
        return self.request.actor

    def meta(self) -> EventMeta:
        """Metadata for the events this command appends (caused by the request)."""
        return EventMeta(
            actor=self.request.actor,
            correlation_id=self.request.correlation_id,
            causation_id=self.request.idempotency_key,
        )


Handler = Callable[[CommandContext[C]], Awaitable[CommandAccepted]]

_REPLY_HEADROOM = 4_096  # for the request's headers, which a reply carries back
_ERRORS_KEPT = 100  # validation errors a reply too large for the bus keeps


class CommandTooLargeError(MaxPayloadError, InvalidError):
    """A command larger than the NATS server carries: refused before anything was sent.

    Still a `MaxPayloadError` (what callers that answer 413 catch, and the first match an
    exception handler finds), and an `InvalidError` for everyone who handles typed errors.
    """

    def __init__(self, message: str) -> None:
        InvalidError.__init__(self, message)

    def __str__(self) -> str:
        return self.message


class CommandClient:
    """Sends commands to their owning service and waits for the reply."""

    def __init__(self, nc: NATS, topology: Topology, *, timeout: float = 10.0) -> None:
        self._nc = nc
        self._topology = topology
        self._timeout = timeout

    async def send(
        self,
        command: Command,
        *,
        actor: str,
        idempotency_key: str | None = None,
        correlation_id: str | None = None,
        timeout: float | None = None,
    ) -> CommandAccepted:
        """The accepted reply, or raise the typed `CommandError` the service answered with.

        Raises:
            UnavailableError: no instance of the owning service is subscribed.
            CommandTimeoutError: no reply in time (the command may still have been applied).
            CommandTooLargeError: the command is larger than NATS carries (nothing was sent).
        """
        extra: dict[str, Any] = {}
        if idempotency_key:
            extra["idempotency_key"] = idempotency_key
        if correlation_id:
            extra["correlation_id"] = correlation_id
        request = CommandRequest(
            service=command.service,
            verb=command.verb,
            actor=actor,
            data=command.model_dump(mode="json"),
            **extra,
        )
        subject = self._topology.command_subject(command.service, command.verb)
        try:
            msg = await Replies.of(self._nc).request(
                subject,
                request.model_dump_json().encode(),
                telemetry.inject({}) or None,
                timeout or self._timeout,
            )
        except NoRespondersError:
            raise UnavailableError(f"no {command.service} service is answering") from None
        except MaxPayloadError:
            raise CommandTooLargeError(
                f"the {command.service}.{command.verb} command is larger than the bus carries"
                f" ({self._nc.max_payload} bytes): send less"
            ) from None
        except NatsTimeoutError:
            raise CommandTimeoutError(
                f"{command.service}.{command.verb} got no reply in time",
                idempotency_key=request.idempotency_key,
            ) from None
        reply = REPLY_ADAPTER.validate_json(msg.data)
        if isinstance(reply, CommandRejected):
            raise CommandError.from_body(reply.error)
        return reply


class CommandRouter:
    """The explicit table of a service's command handlers (grep finds them all here)."""

    def __init__(self, service: str) -> None:
        self.service = service
        self._routes: dict[str, tuple[type[Command], Handler[Any]]] = {}

    def register(self, command_type: type[C], handler: Handler[C]) -> None:
        if command_type.service != self.service:
            raise ValueError(f"{command_type.__name__} belongs to {command_type.service}")
        if command_type.verb in self._routes:
            raise ValueError(f"{self.service}.{command_type.verb} has a handler already")
        self._routes[command_type.verb] = (command_type, handler)

    @property
    def verbs(self) -> tuple[str, ...]:
        return tuple(self._routes)

    async def dispatch(self, request: CommandRequest) -> CommandReplyModel:
        route = self._routes.get(request.verb)
        if route is None or request.service != self.service:
            return _rejected(InvalidError(f"unknown command {request.service}.{request.verb}"))
        command_type, handler = route
        try:
            command = command_type.model_validate(request.data)
        except ValidationError as exc:
            return _rejected(_invalid(exc))
        try:
            return await handler(CommandContext(command, request))
        except Exception as exc:
            return _rejected(_failure(exc, request))


def _failure(exc: Exception, request: CommandRequest) -> CommandError:
    """What a handler's exception tells its caller."""
    if isinstance(exc, CommandError):
        return exc
    if isinstance(exc, UnknownEventTypeError | NewerSchemaError):
        # Mid-upgrade: a newer release wrote an event this one cannot read. Not a fault
        # to give up on (a 500 says so): once this service is upgraded too it reads it.
        log.warning("command.newer_events", verb=request.verb, error=f"{type(exc).__name__}: {exc}")
        why = "a newer release wrote events this service cannot read yet: try again later"
        return UnavailableError(why)
    if is_trouble(exc):
        # NATS or Postgres in trouble under the handler (a stream electing its leader refused
        # the append: nothing stored): `unavailable`, to try again. The API answers 503, which
        # an Idempotency-Key's slot does not keep, where an `internal` 500 was kept and
        # replayed to every retry for a day.
        log.warning("command.trouble", verb=request.verb, correlation_id=request.correlation_id,
                    error=f"{type(exc).__name__}: {exc}"[:500])  # fmt: skip
        return UnavailableError("the platform's servers are in trouble: try again")
    log.error(
        "command.crashed", verb=request.verb, correlation_id=request.correlation_id, exc_info=exc
    )
    return InternalError("the command failed unexpectedly")


def _invalid(exc: ValidationError) -> InvalidError:
    errors = [
        {"loc": ".".join(str(p) for p in e["loc"]), "msg": e["msg"], "type": e["type"]}
        for e in exc.errors(include_url=False, include_input=False)
    ]
    return InvalidError("the command is not valid", errors=errors)


def _rejected(error: CommandError) -> CommandRejected:
    return CommandRejected(error=error.to_body())


class CommandServer:
    """Answers `cmd.<service>.*` in a queue group, so replicas share the load."""

    def __init__(
        self, nc: NATS, topology: Topology, router: CommandRouter, *, max_in_flight: int = 256
    ) -> None:
        self._nc = nc
        self._topology = topology
        self._router = router
        self._sub: Subscription | None = None
        self._in_flight: set[asyncio.Task[None]] = set()
        self._slots = asyncio.Semaphore(max_in_flight)

    async def start(self) -> None:
        service = self._router.service
        self._sub = await self._nc.subscribe(
            self._topology.command_filter(service),
            queue=self._topology.command_queue_group(service),
            cb=self._on_request,
        )

    async def _on_request(self, msg: Msg) -> None:
        # Callbacks of one subscription run one after another; handle each in its own task.
        await self._slots.acquire()
        task = asyncio.create_task(self._handle(msg))
        self._in_flight.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._in_flight.discard(task)
        self._slots.release()
        if not task.cancelled() and (exc := task.exception()) is not None:
            # The reply could not go out (the connection closed or reconnecting with its
            # buffer full): the client waits out its timeout, and this says why.
            log.warning("command.reply_failed", service=self._router.service,
                        error=repr(exc))  # fmt: skip

    async def _handle(self, msg: Msg) -> None:
        verb = msg.subject.rsplit(".", 1)[-1]
        with telemetry.tracer.start_as_current_span(
            f"command {self._router.service}.{verb}",
            context=telemetry.extract(msg.headers),
            kind=SpanKind.SERVER,
        ) as span:
            try:
                request = CommandRequest.model_validate_json(msg.data)
            except ValidationError as exc:
                reply: CommandReplyModel = _rejected(_invalid(exc))
            else:
                reply = await self._router.dispatch(request)
            outcome = "ok" if isinstance(reply, CommandAccepted) else reply.error.code.value
            if isinstance(reply, CommandRejected) and reply.error.code == ErrorCode.INTERNAL:
                span.set_status(Status(StatusCode.ERROR))
        _commands.add(1, {"service": self._router.service, "verb": verb, "outcome": outcome})
        if msg.reply:
            await msg.respond(self._fitting(reply, verb))

    def _fitting(self, reply: CommandReplyModel, verb: str) -> bytes:
        """The reply, cut to what the bus carries: one that does not fit would never leave,
        and the client would wait out its timeout for an answer the service had (thousands of
        validation errors of a large list, say)."""
        limit = self._nc.max_payload - _REPLY_HEADROOM
        body = REPLY_ADAPTER.dump_json(reply)
        if len(body) <= limit:
            return body
        log.warning("command.reply_too_large", verb=verb, size=len(body))
        if isinstance(reply, CommandAccepted):
            # Applied: the position (what to wait for) and the result say so; the event list
            # is what grows with the command.
            body = REPLY_ADAPTER.dump_json(reply.model_copy(update={"events": ()}))
            if len(body) <= limit:
                return body
            reply = _rejected(InternalError("the command was applied; its reply was too large"))
            return REPLY_ADAPTER.dump_json(reply)
        error = reply.error
        details: dict[str, Any] = {}
        errors = error.details.get("errors")
        if isinstance(errors, list):
            omitted = len(errors) - _ERRORS_KEPT
            details = {"errors": errors[:_ERRORS_KEPT], "errors_omitted": omitted}
        cut = CommandRejected(
            error=ErrorBody(code=error.code, message=error.message[:2_000], details=details)
        )
        body = REPLY_ADAPTER.dump_json(cut)
        if len(body) <= limit:
            return body
        cut = CommandRejected(error=ErrorBody(code=error.code, message=error.message[:2_000]))
        return REPLY_ADAPTER.dump_json(cut)

    async def drain(self, timeout: float) -> None:
        """Stop taking commands and let the ones in hand finish (up to `timeout` seconds).

        In hand are also the commands delivered here but not started yet (waiting for a slot):
        the subscription is drained, not dropped, or their clients would wait out a timeout
        and be told the command may or may not have been applied."""
        deadline = asyncio.get_running_loop().time() + timeout
        sub, self._sub = self._sub, None
        if sub is not None:
            try:
                await asyncio.wait_for(sub.drain(), timeout)  # type: ignore[no-untyped-call]
            except (TimeoutError, NatsError):
                log.warning("command.drain_incomplete", service=self._router.service)
        left = deadline - asyncio.get_running_loop().time()
        if self._in_flight and left > 0:
            await asyncio.wait(set(self._in_flight), timeout=left)
