"""Kill -9 the orchestrator while 20 activations run in Docker containers (a real engine, the
real runner image), start it again: every activation ends in exactly one terminal state, the
file each left in /workspace/out becomes an artifact all the same, and no container is left
behind. The model is the scripted one (a fake provider)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import docker  # type: ignore[import-untyped]
import pytest
import pytest_asyncio

from suzumio.contracts.commands import SetRuntimeProfile, UpdateAgent
from suzumio.contracts.events import ActivationRequested
from suzumio.contracts.events.activation import TERMINAL_ACTIVATION_EVENTS
from suzumio.contracts.values import Backend, RuntimeProfileSpec
from suzumio.platform.bus.commands import CommandClient
from suzumio.testing.model_server import Reply, ScriptedModelServer, ToolCall
from tests.e2e.api import World, new_world
from tests.e2e.runner_env import post
from tests.e2e.stack import Stack
from tests.fault.faultkit import restart, service, whole_platform
from tests.support import eventually

ACTIVATIONS = 20
COMPLETED = "activation.completed"


def write_then_answer_slowly(request: dict[str, Any]) -> Reply:
    """First a file in out/, then — once its result is in the conversation — a slow answer."""
    if any(m.get("role") == "tool" for m in request.get("messages") or []):
        return Reply.text("finished after a while", delay=6.0)
    return Reply.tool_calls(
        [ToolCall("file_write", {"path": "out/result.txt", "content": "the work"})]
    )


@pytest_asyncio.fixture
async def slow_model() -> AsyncIterator[ScriptedModelServer]:
    async with ScriptedModelServer(default=write_then_answer_slowly) as m:
        yield m


@pytest_asyncio.fixture
async def stack(
    nats_url: str, postgres_url: str, tmp_path: Path, slow_model: ScriptedModelServer
) -> AsyncIterator[Stack]:
    env = {"SUZUMIO_BACKENDS": '["docker", "process"]'}
    async with whole_platform(nats_url, postgres_url, tmp_path, slow_model.url, env) as s:
        yield s


async def on_docker(stack: Stack, world: World) -> None:
    commands = CommandClient(stack.nc, stack.topology)
    profile = RuntimeProfileSpec(backend=Backend.DOCKER, image="suzumio-runner:latest")
    await commands.send(
        SetRuntimeProfile(project_id=world.project_id, name="box", spec=profile), actor="system:t"
    )
    await commands.send(
        UpdateAgent(agent_id=world.agent_id, runtime_profile="box"), actor="system:t"
    )


async def activation_of(stack: Stack, world: World) -> list[str]:
    stream = await stack.store.load("session", world.session_id)
    return [e.data.activation_id for e in stream.events if isinstance(e.data, ActivationRequested)]


async def artifact_paths(stack: Stack, world: World) -> list[str]:
    async with stack.client(world.key) as c:
        listed = await c.get(f"/v1/projects/{world.project_id}/artifacts")
    return [a["path"] for a in listed.json()["items"]]


async def types_of(stack: Stack, activation_id: str) -> list[str]:
    return [e.envelope.type for e in (await stack.store.load("activation", activation_id)).events]


def containers(namespace: str) -> list[object]:
    client = docker.from_env()
    try:
        return list(
            client.containers.list(
                all=True,
                filters={"label": ["io.suzumio.managed=true", f"io.suzumio.namespace={namespace}"]},
                sparse=True,  # no inspection of each: one removed meanwhile is no error
            )
        )
    finally:
        client.close()


@pytest.mark.timeout(300)
async def test_kill_9_the_orchestrator_mid_run_and_restart(stack: Stack) -> None:
    worlds = [await new_world(stack, f"k{i}") for i in range(ACTIVATIONS)]  # a project each
    for world in worlds:
        await on_docker(stack, world)
    for world in worlds:
        await post(stack, world, "work slowly")
    ids: list[str] = []
    for world in worlds:

        async def requested(w: World = world) -> list[str]:
            return await activation_of(stack, w)

        [activation_id] = await eventually(requested, lambda x: len(x) == 1, what="request")
        ids.append(activation_id)

    async def started() -> int:
        return sum(["activation.started" in await types_of(stack, i) for i in ids])

    await eventually(started, lambda n: n >= ACTIVATIONS // 2, timeout=120, what="starts")
    orchestrator = service(stack, "orchestrator")
    orchestrator.kill()  # SIGKILL: no drain, no cleanup
    assert containers(stack.topology.namespace), "containers should outlive the orchestrator"
    await asyncio.sleep(2.0)
    await restart(orchestrator)

    async def ended() -> list[list[str]]:
        return [await types_of(stack, i) for i in ids]

    stories = await eventually(
        ended,
        lambda all_: all(any(t in TERMINAL_ACTIVATION_EVENTS for t in types) for types in all_),
        timeout=180,
        what="every activation's end",
    )
    for story in stories:
        assert len([t for t in story if t in TERMINAL_ACTIVATION_EVENTS]) == 1, story
        assert story.count("activation.started") <= 1, story
    completed = [w for w, story in zip(worlds, stories, strict=True) if story[-1] == COMPLETED]
    assert len(completed) >= ACTIVATIONS // 2, stories  # those watched again finished normally
    for world in completed:  # collected by the orchestrator that found them again, too
        await eventually(
            lambda w=world: artifact_paths(stack, w),  # type: ignore[misc]
            lambda paths: paths == ["result.txt"],
            what=f"the artifact of {world.project_id}",
        )
    await eventually(
        lambda: asyncio.to_thread(containers, stack.topology.namespace),
        lambda left: left == [],
        timeout=60,
        what="no container left",
    )
