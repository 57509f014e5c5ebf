"""The example toolpack `todo` (examples/toolpacks/todo) through the real tool-broker: the broker
found its manifest when it started, runs the operations it allowlists for activations whose
token names it, and refuses everything else before anything reaches the log. And through the
real scheduler, which runs the manifest's hook for the agents that enable `todo`."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

from suzumio.contracts.commands import UpdateAgent
from suzumio.contracts.events import ActivationRequested, SignalRecorded
from suzumio.contracts.values import Priority, SignalKind
from suzumio.orchestrator.backends.base import Backend
from suzumio.orchestrator.backends.process import ProcessBackend
from suzumio.orchestrator.settings import OrchestratorSettings
from suzumio.platform.bus.commands import CommandClient
from suzumio.platform.tokens import TokenSigner
from suzumio.testing.model_server import Reply, ScriptedModelServer
from tests.backend_suite import TERMINAL, harness
from tests.e2e.api import World, new_world, ok, problem
from tests.e2e.runner_env import post, request_activation
from tests.e2e.stack import Stack
from tests.support import eventually


def token_for(stack: Stack, world: World, activation_id: str, toolpacks: Sequence[str]) -> str:
    return TokenSigner([stack.secret_key]).issue(
        activation_id=activation_id,
        session_id=world.session_id,
        project_id=world.project_id,
        agent_id=world.agent_id,
        toolpacks=tuple(toolpacks),
        ttl=timedelta(minutes=5),
    )


def broker(stack: Stack, token: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=stack.url_of("toolbroker"),
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
    )


def call(operation: str, request_id: str, **arguments: Any) -> dict[str, Any]:
    return {"operation": operation, "arguments": arguments, "request_id": request_id}


async def recorded(stack: Stack, world: World) -> list[SignalRecorded]:
    stream = await stack.store.load("session", world.session_id)
    return [e.data for e in stream.events if isinstance(e.data, SignalRecorded)]


async def log_sizes(stack: Stack, world: World, activation_id: str) -> tuple[int, int]:
    session = await stack.store.load("session", world.session_id)
    activation = await stack.store.load("activation", activation_id)
    return len(session.events), len(activation.events)


async def test_todo_remind_records_a_reminder_for_the_session(platform: Stack) -> None:
    world = await new_world(platform, "tilda")
    activation_id = await request_activation(platform, world)
    token = token_for(platform, world, activation_id, ["todo"])
    before = datetime.now(UTC)
    body = call("todo.remind", "r1", text="check the build", delay_seconds=600)
    async with broker(platform, token) as c:
        first = ok(await c.post("/toolpacks/todo/support", json=body))
        retried = ok(await c.post("/toolpacks/todo/support", json=body))
    signal_id = first["result"]["signal_id"]
    assert retried == first  # the same call again records nothing twice

    [signal] = await eventually(
        lambda: recorded(platform, world), lambda s: len(s) == 1, what="the reminder"
    )
    assert signal.signal_id == signal_id
    assert (signal.agent_id, signal.kind, signal.priority) == (
        world.agent_id,
        SignalKind.CUSTOM,
        Priority.P3,
    )
    assert signal.payload == {
        "text": "check the build",
        "kind": "todo.reminder",
        "toolpack": "todo",
    }
    assert signal.not_before is not None
    assert timedelta(seconds=600) <= signal.not_before - before < timedelta(seconds=660)


async def test_bad_arguments_are_refused_and_record_nothing(platform: Stack) -> None:
    world = await new_world(platform, "tobias")
    activation_id = await request_activation(platform, world)
    token = token_for(platform, world, activation_id, ["todo"])
    sizes = await log_sizes(platform, world, activation_id)
    async with broker(platform, token) as c:
        response = await c.post(
            "/toolpacks/todo/support", json=call("todo.remind", "r1", delay_seconds=-5)
        )
    problem(response, 422, "invalid")
    assert await log_sizes(platform, world, activation_id) == sizes


async def test_operations_outside_the_todo_allowlist_are_refused(platform: Stack) -> None:
    world = await new_world(platform, "tamsin")
    activation_id = await request_activation(platform, world)
    token = token_for(platform, world, activation_id, ["todo"])
    sizes = await log_sizes(platform, world, activation_id)
    async with broker(platform, token) as c:
        # An unknown name, and a core operation asked for under the toolpack's name.
        for operation in ("todo.purge", "signal.record"):
            response = await c.post(
                "/toolpacks/todo/support", json=call(operation, f"r-{operation}", kind="x")
            )
            body = problem(response, 403, "forbidden")
            assert operation in body["detail"]
    assert await log_sizes(platform, world, activation_id) == sizes
    assert await recorded(platform, world) == []


async def test_a_token_that_does_not_name_todo_cannot_use_it(platform: Stack) -> None:
    world = await new_world(platform, "tomek")
    activation_id = await request_activation(platform, world)
    sizes = await log_sizes(platform, world, activation_id)
    for toolpacks in ((), ("files", "shell")):
        token = token_for(platform, world, activation_id, toolpacks)
        async with broker(platform, token) as c:
            response = await c.post(
                "/toolpacks/todo/support", json=call("todo.remind", "r1", text="sneaky")
            )
        body = problem(response, 403, "forbidden")
        assert "'todo' is not enabled" in body["detail"]
    assert await log_sizes(platform, world, activation_id) == sizes
    assert await recorded(platform, world) == []


async def test_the_scheduler_reminds_the_agents_that_enable_todo_and_no_other(
    platform: Stack, model: ScriptedModelServer, tmp_path: Path
) -> None:
    """The real scheduler found the manifest's hook at its start: after a useful activation
    of an agent that enables `todo`, one reminder for later; an agent without it gets none."""

    async def process_backend(settings: OrchestratorSettings) -> Backend:
        return ProcessBackend(settings.sandboxes())

    commands = CommandClient(platform.nc, platform.topology)
    # Every call gets it: the module's earlier tests left requested activations, which this
    # orchestrator starts too.
    model.default = Reply.text("done, and useful")
    async with harness(platform, model, tmp_path, process_backend, "process") as h:
        worlds = [await h.world("todo"), await h.world("plain")]
        await commands.send(
            UpdateAgent(agent_id=worlds[0].agent_id, toolpacks=("todo",)), actor="system:test"
        )
        for world in worlds:
            before = datetime.now(UTC)
            await post(platform, world, "do the thing")
            answered = await eventually(
                functools.partial(activation_ends, platform, world),
                lambda ends: len(ends) == 1,
                timeout=90,
                what="the activation's end",
            )
            assert answered == ["activation.completed"]
        reminders = await eventually(
            lambda: recorded(platform, worlds[0]),
            lambda signals: any(s.payload.get("kind") == "todo.reminder" for s in signals),
            timeout=30,
            what="the todo agent's reminder",
        )
    [reminder] = [s for s in reminders if s.payload.get("kind") == "todo.reminder"]
    assert (reminder.kind, reminder.priority) == (SignalKind.CUSTOM, Priority.P3)
    assert reminder.payload["hook"] == "todo:suzumio_todo.hooks:remind_when_idle"
    assert reminder.not_before is not None
    assert reminder.not_before - before >= timedelta(minutes=29)
    # The other agent's session was reviewed as well (before the todo one's): no reminder.
    assert not [s for s in await recorded(platform, worlds[1]) if s.payload.get("hook")]


async def activation_ends(stack: Stack, world: World) -> list[str]:
    session = await stack.store.load("session", world.session_id)
    ids = [e.data.activation_id for e in session.events if isinstance(e.data, ActivationRequested)]
    ends: list[str] = []
    for activation_id in ids:
        types = [
            e.envelope.type for e in (await stack.store.load("activation", activation_id)).events
        ]
        ends += [t for t in types if t in TERMINAL]
    return ends
