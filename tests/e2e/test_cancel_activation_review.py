"""A user cancels a running activation through the API (DESIGN.md §2, §7: "cancel or P0
revokes it at once"): the real session, scheduler, orchestrator (process backend), tool-broker
and gateway, with the scripted model (a fake OpenAI-compatible provider) asking for a long
`shell.exec`. The cancel is 202; the activation ends `activation.cancelled`, its sandbox's
processes and directory are gone, its real token (read from its input file) is refused from
the cancel on, and a second cancel is the documented 409."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import pytest_asyncio

from suzumio.contracts.events import ActivationRequested, ActivationStarted
from suzumio.contracts.ids import new_id
from suzumio.testing.model_server import Reply, ScriptedModelServer, ToolCall
from tests.e2e.api import World, new_user, new_world, ok
from tests.e2e.runner_env import post
from tests.e2e.stack import Stack, running_stack
from tests.e2e.test_cli_agents import cli
from tests.support import eventually

SERVICES = ("session", "scheduler", "orchestrator", "toolbroker", "gateway")
TERMINAL = {"activation.completed", "activation.failed", "activation.cancelled"}


@pytest_asyncio.fixture(scope="module")
async def scripted() -> AsyncIterator[ScriptedModelServer]:
    async with ScriptedModelServer() as server:
        yield server


@pytest_asyncio.fixture(scope="module")
async def stack(
    nats_url: str,
    postgres_url: str,
    tmp_path_factory: pytest.TempPathFactory,
    scripted: ScriptedModelServer,
) -> AsyncIterator[tuple[Stack, Path]]:
    tmp = Path(tmp_path_factory.mktemp("cancel"))
    env = {
        "SUZUMIO_MODEL_BASE_URL": f"{scripted.url}/v1",
        "SUZUMIO_MODEL_API_KEY": "sk-e2e-secret",
        "SUZUMIO_BACKENDS": '["process"]',
    }
    async with running_stack(nats_url, postgres_url, tmp, SERVICES, env) as s:
        yield s, tmp / "sandboxes"


def holding(needle: str) -> list[int]:
    """The pids of the processes whose command line holds `needle`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if needle in cmdline:
                found.append(int(entry.name))
    return found


async def requested(stack: Stack, world: World) -> list[str]:
    stream = await stack.store.load("session", world.session_id)
    return [e.data.activation_id for e in stream.events if isinstance(e.data, ActivationRequested)]


async def story(stack: Stack, activation_id: str) -> list[str]:
    stream = await stack.store.load("activation", activation_id)
    return [e.envelope.type for e in stream.events]


async def take_signals(stack: Stack, token: str) -> httpx.Response:
    """A call only a live activation's token may make."""
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=stack.url_of("toolbroker"), headers=headers) as c:
        return await c.post("/runner/signals", json={"received": []}, timeout=30)


async def test_a_user_cancels_a_running_activation(
    stack: tuple[Stack, Path], scripted: ScriptedModelServer
) -> None:
    platform, sandboxes = stack
    world = await new_world(platform, "cancel")
    marker = f"still-running-{new_id()[-8:]}"
    scripted.script(
        [
            Reply.tool_calls([ToolCall("shell_exec", {"command": f"sleep 300; echo {marker}"})]),
            Reply.text("done"),  # the next activation: a new message's
        ]
    )
    await post(platform, world, "take your time")
    [activation_id] = await eventually(
        lambda: requested(platform, world), lambda ids: len(ids) == 1, what="the request"
    )
    try:
        await eventually(
            lambda: asyncio.sleep(0, holding(marker)), bool, timeout=60, what="the shell command"
        )
        directory = sandboxes / "activations" / activation_id
        token = json.loads((directory / "input.json").read_text())["token"]
        assert (await take_signals(platform, token)).status_code == 200  # live: it works
        path = f"/v1/activations/{activation_id}/cancel"

        # Not the caller's project: 404, like a missing activation; a viewer: 403.
        stranger, _ = await new_user(platform, "stranger")
        viewer, viewer_id = await new_user(platform, "viewer")
        async with platform.client(world.key) as c:
            ok(
                await c.put(
                    f"/v1/projects/{world.project_id}/members/{viewer_id}",
                    json={"role": "viewer"},
                )
            )
        for key, expected in ((stranger, 404), (viewer, 403)):
            async with platform.client(key) as c:
                refused = await c.post(path, json={})
            assert refused.status_code == expected, refused.text
            assert refused.headers["content-type"] == "application/problem+json"
        async with platform.client(world.key) as c:
            missing = await c.post(f"/v1/activations/{new_id()}/cancel")
            assert missing.status_code == 404, missing.text
            bad = await c.post(path, json={"reason": "x", "force": True})
            assert bad.status_code == 422, bad.text
        assert "activation.cancelled" not in await story(platform, activation_id)

        # The cancel: 202 with the activation, and where the write is in the log.
        once = {"Idempotency-Key": "cancel-1"}
        async with platform.client(world.key) as c:
            accepted = await c.post(path, json={"reason": "wrong prompt"}, headers=once)
        assert accepted.status_code == 202, accepted.text
        assert int(accepted.headers["suzumio-position"]) > 0
        body = accepted.json()
        assert body["id"] == activation_id
        assert body["cancel_requested"] is True
        # Fenced at once: the token is refused from the cancel on, the sandbox still dying.
        fenced = await take_signals(platform, token)
        assert fenced.status_code == 403, fenced.text

        types = await eventually(
            lambda: story(platform, activation_id),
            lambda t: bool(TERMINAL & set(t)),
            timeout=60,
            what="the activation's end",
        )
        assert [t for t in types if t in TERMINAL] == ["activation.cancelled"], types
        stream = await platform.store.load("activation", activation_id)
        [started] = [e.data for e in stream.events if isinstance(e.data, ActivationStarted)]
        # The sandbox is gone: the runner (its pid, on the process backend; its command line
        # names its directory), the shell command it ran, and the directory itself.
        runner = Path(f"/proc/{int(started.sandbox_id)}")

        def alive() -> list[int]:
            found = holding(str(directory)) + holding(marker)
            return found + [int(started.sandbox_id)] if runner.exists() else found

        left = await eventually(
            lambda: asyncio.sleep(0, alive()),
            lambda pids: not pids,
            timeout=30,
            what="the sandbox's processes to end (and be reaped)",
        )
        assert left == []
        await eventually(
            lambda: asyncio.sleep(0, directory.exists()),
            lambda exists: not exists,
            timeout=30,
            what="the sandbox's directory removed",
        )
        assert (await take_signals(platform, token)).status_code == 403

        async with platform.client(world.key) as c:
            row = await eventually(
                lambda: c.get(f"/v1/activations/{activation_id}"),
                lambda r: r.json()["status"] == "cancelled",
                what="the read model",
            )
            assert row.json()["cancel_requested"] is True
            assert "wrong prompt" in row.json()["end_reason"], row.json()
            # A second cancel: the activation has ended, 409 (a retry with the first's key
            # gets the first answer back).
            again = await c.post(path)
            assert again.status_code == 409, again.text
            assert again.json()["code"] == "conflict"
            assert "already ended (cancelled)" in again.json()["detail"]
            replayed = await c.post(path, json={"reason": "wrong prompt"}, headers=once)
            assert replayed.status_code == 202
            assert replayed.headers.get("idempotent-replayed") == "true"

        # The CLI says the same, on one line, and fails.
        said = await cli(platform, world.key, "activations", "cancel", activation_id)
        assert said.returncode == 1, said
        assert "409: the activation has already ended (cancelled)" in said.stderr, said
        said = await cli(platform, world.key, "activations", "cancel", "no-such-one")
        assert said.returncode == 1, said
        assert "404: activation not found" in said.stderr, said

        # docs/api.md: the work goes with it. The message's signal is closed `cancelled`, and
        # the session's next activation — for a new message — does not take it again.
        async def signals() -> list[dict[str, object]]:
            async with platform.client(world.key) as c:
                items: list[dict[str, object]] = ok(
                    await c.get(f"/v1/sessions/{world.session_id}/signals")
                )["items"]
            return items

        [closed] = await eventually(
            signals, lambda xs: [x["status"] for x in xs] == ["cancelled"], what="the close"
        )
        assert "cancelled by user:" in str(closed["reason"])
        await post(platform, world, "something else")
        ids = await eventually(
            lambda: requested(platform, world), lambda ids: len(ids) == 2, what="the next"
        )
        stream = await platform.store.load("session", world.session_id)
        [nxt] = [
            e.data
            for e in stream.events
            if isinstance(e.data, ActivationRequested) and e.data.activation_id == ids[1]
        ]
        assert closed["id"] not in nxt.signal_ids, "the cancelled work started again"
        after = await eventually(
            lambda: story(platform, ids[1]), lambda t: bool(TERMINAL & set(t)), timeout=60
        )
        assert "activation.completed" in after, after
    finally:  # what a failed cancel left behind, started by this test
        for pid in holding(marker):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
