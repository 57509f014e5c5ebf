"""Command request/reply over real NATS: typed results, typed errors, timeouts, draining."""

from __future__ import annotations

import asyncio

import nats.errors
import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from structlog.testing import capture_logs

from suzumio.contracts.commands import CommandAccepted, CreateProject, RenameProject
from suzumio.contracts.envelope import NewerSchemaError, UnknownEventTypeError
from suzumio.contracts.errors import (
    CommandTimeoutError,
    ConflictError,
    InternalError,
    InvalidError,
    NotFoundError,
    UnavailableError,
)
from suzumio.contracts.subjects import Topology
from suzumio.platform.bus.commands import (
    CommandClient,
    CommandContext,
    CommandRouter,
    CommandServer,
)


async def serve(nc: NATS, topology: Topology, router: CommandRouter) -> CommandServer:
    server = CommandServer(nc, topology, router)
    await server.start()
    await nc.flush()
    return server


async def test_reply_carries_the_handlers_result_and_context(
    nc: NATS, topology: Topology, commands: CommandClient
) -> None:
    seen: list[CommandContext[CreateProject]] = []

    async def create(ctx: CommandContext[CreateProject]) -> CommandAccepted:
        seen.append(ctx)
        return CommandAccepted(position=7, result={"name": ctx.command.name})

    router = CommandRouter("session")
    router.register(CreateProject, create)
    await serve(nc, topology, router)

    reply = await commands.send(
        CreateProject(project_id="p1", name="alpha"),
        actor="user:u1",
        idempotency_key="k1",
        correlation_id="c1",
    )

    assert reply.result == {"name": "alpha"}
    assert reply.position == 7
    ctx = seen[0]
    assert ctx.actor == "user:u1"
    assert ctx.meta().correlation_id == "c1"
    assert ctx.meta().causation_id == "k1"


@pytest.mark.parametrize(
    ("raised", "expected"),
    [
        (NotFoundError("no such project"), NotFoundError),
        (ConflictError("renamed meanwhile", actual_version=3), ConflictError),
        (InvalidError("bad name"), InvalidError),
        (RuntimeError("bug"), InternalError),
        # Mid-upgrade, a newer release's event on the aggregate: try again, not a fault.
        (UnknownEventTypeError("session.from_the_future"), UnavailableError),
        (NewerSchemaError("session.opened schema 9 is newer than this code's 1"), UnavailableError),
    ],
)
async def test_handler_errors_come_back_typed(
    nc: NATS,
    topology: Topology,
    commands: CommandClient,
    raised: Exception,
    expected: type[Exception],
) -> None:
    async def rename(_: CommandContext[RenameProject]) -> CommandAccepted:
        raise raised

    router = CommandRouter("session")
    router.register(RenameProject, rename)
    await serve(nc, topology, router)

    with pytest.raises(expected) as info:
        await commands.send(RenameProject(project_id="p1", name="x"), actor="user:u1")
    if isinstance(raised, ConflictError):
        assert info.value.details == {"actual_version": 3}  # type: ignore[attr-defined]
    if expected is InternalError:
        assert "bug" not in str(info.value)  # internals stay in the service's log


async def test_payload_that_fails_validation_is_invalid_with_locations(
    nc: NATS, topology: Topology, commands: CommandClient
) -> None:
    router = CommandRouter("session")

    async def create(_: CommandContext[CreateProject]) -> CommandAccepted:
        raise AssertionError("must not run")

    router.register(CreateProject, create)
    await serve(nc, topology, router)
    bad = CreateProject.model_construct(project_id="p1", name="")  # bypasses client-side validation

    with pytest.raises(InvalidError) as info:
        await commands.send(bad, actor="user:u1")
    assert info.value.details["errors"][0]["loc"] == "name"


async def test_unknown_verb_is_invalid(
    nc: NATS, topology: Topology, commands: CommandClient
) -> None:
    await serve(nc, topology, CommandRouter("session"))
    with pytest.raises(InvalidError, match="unknown command"):
        await commands.send(CreateProject(project_id="p1", name="a"), actor="user:u1")


async def test_nobody_listening_is_unavailable(commands: CommandClient) -> None:
    with pytest.raises(UnavailableError):
        await commands.send(CreateProject(project_id="p1", name="a"), actor="user:u1")


async def test_slow_service_times_out(nc: NATS, topology: Topology) -> None:
    release = asyncio.Event()

    async def create(_: CommandContext[CreateProject]) -> CommandAccepted:
        await release.wait()
        return CommandAccepted()

    router = CommandRouter("session")
    router.register(CreateProject, create)
    server = await serve(nc, topology, router)
    client = CommandClient(nc, topology, timeout=0.3)

    with pytest.raises(CommandTimeoutError):
        await client.send(
            CreateProject(project_id="p1", name="a"), actor="user:u1", idempotency_key="slow-1"
        )
    release.set()
    await server.drain(2.0)


async def test_a_reply_that_cannot_go_out_is_logged(
    nc: NATS, topology: Topology, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reply's send failed (the connection closed, or reconnecting with its buffer full):
    the client waits out its timeout, and the service said nothing of why — only asyncio's
    "exception was never retrieved", outside the service's log."""

    async def create(_: CommandContext[CreateProject]) -> CommandAccepted:
        return CommandAccepted()

    async def buffer_full(self: Msg, data: bytes) -> None:
        raise nats.errors.OutboundBufferLimitError

    router = CommandRouter("session")
    router.register(CreateProject, create)
    server = await serve(nc, topology, router)
    client = CommandClient(nc, topology, timeout=0.5)
    monkeypatch.setattr(Msg, "respond", buffer_full)
    with capture_logs() as logs, pytest.raises(CommandTimeoutError):
        await client.send(
            CreateProject(project_id="p1", name="a"), actor="user:u1", idempotency_key="lost-1"
        )
    monkeypatch.undo()
    [failed] = [r for r in logs if r["event"] == "command.reply_failed"]
    assert "OutboundBufferLimitError" in failed["error"]
    await server.drain(2.0)


async def test_drain_finishes_commands_in_hand(
    nc: NATS, topology: Topology, commands: CommandClient
) -> None:
    started = asyncio.Event()

    async def create(_: CommandContext[CreateProject]) -> CommandAccepted:
        started.set()
        await asyncio.sleep(0.3)
        return CommandAccepted(result={"done": True})

    router = CommandRouter("session")
    router.register(CreateProject, create)
    server = await serve(nc, topology, router)
    pending = asyncio.create_task(
        commands.send(CreateProject(project_id="p1", name="a"), actor="user:u1")
    )
    await started.wait()

    await server.drain(5.0)

    assert (await pending).result == {"done": True}
    with pytest.raises(UnavailableError):  # and no new command is taken
        await commands.send(CreateProject(project_id="p1", name="b"), actor="user:u1")


async def test_replicas_share_commands_in_a_queue_group(
    nc: NATS, topology: Topology, commands: CommandClient
) -> None:
    handled: list[str] = []

    def handler(name: str):
        async def create(_: CommandContext[CreateProject]) -> CommandAccepted:
            handled.append(name)
            return CommandAccepted()

        return create

    for name in ("a", "b"):
        router = CommandRouter("session")
        router.register(CreateProject, handler(name))
        await serve(nc, topology, router)

    await asyncio.gather(
        *(commands.send(CreateProject(project_id="p1", name="x"), actor="u") for _ in range(40))
    )

    assert len(handled) == 40  # each command handled once, not once per replica
    assert set(handled) == {"a", "b"}


async def test_drain_also_finishes_commands_waiting_for_a_slot(
    nc: NATS, topology: Topology, commands: CommandClient
) -> None:
    # One slot: the second command is delivered but waits, and a drain must not drop it.
    started = asyncio.Event()

    async def create(ctx: CommandContext[CreateProject]) -> CommandAccepted:
        started.set()
        await asyncio.sleep(0.3)
        return CommandAccepted(result={"name": ctx.command.name})

    router = CommandRouter("session")
    router.register(CreateProject, create)
    server = CommandServer(nc, topology, router, max_in_flight=1)
    await server.start()
    await nc.flush()
    first = asyncio.create_task(
        commands.send(CreateProject(project_id="p1", name="a"), actor="user:u1")
    )
    await started.wait()
    second = asyncio.create_task(
        commands.send(CreateProject(project_id="p2", name="b"), actor="user:u1")
    )
    await asyncio.sleep(0.1)  # delivered, queued behind the one slot

    await server.drain(5.0)

    assert (await first).result == {"name": "a"}
    assert (await second).result == {"name": "b"}
