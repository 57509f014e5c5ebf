"""The behaviour every sandbox backend must show, driven through the real orchestrator engine
(in-process) against the real session, scheduler and tool-broker processes and a scripted model
(the one fake provider): launch → output → terminal event; cancel; timeout; a crash with a
non-zero exit; cleanup; the session's files in `/workspace/in` and `/workspace/out`'s files
back as artifacts. Each backend's test module supplies a `BackendFactory`."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from suzumio.contracts.commands import SetRuntimeProfile, UpdateAgent
from suzumio.contracts.envelope import EventMeta
from suzumio.contracts.events import ActivationCancelRequested, ActivationFailed
from suzumio.contracts.ids import new_id
from suzumio.contracts.subjects import ARTIFACTS_BUCKET
from suzumio.contracts.values import Backend as BackendName
from suzumio.contracts.values import NetworkProfile, RuntimeProfileSpec, Timeouts
from suzumio.orchestrator.artifacts import ArtifactCollector
from suzumio.orchestrator.backends.base import Backend
from suzumio.orchestrator.engine import Orchestrator
from suzumio.orchestrator.planning import Planner
from suzumio.orchestrator.settings import OrchestratorSettings
from suzumio.platform.bus.commands import CommandClient
from suzumio.platform.bus.kv import ensure_object_store
from suzumio.platform.db import pool as db
from suzumio.platform.secrets import SecretBox
from suzumio.platform.tokens import TokenSigner
from suzumio.testing.model_server import Reply, ScriptedModelServer, ToolCall
from tests.e2e.api import World, new_world, upload_artifact
from tests.e2e.runner_env import request_activation
from tests.e2e.stack import Stack
from tests.support import eventually

BackendFactory = Callable[[OrchestratorSettings], Awaitable[Backend]]
TERMINAL = (
    "activation.completed",
    "activation.failed",
    "activation.cancelled",
    "activation.timed_out",
)


@dataclass
class Harness:
    stack: Stack
    model: ScriptedModelServer
    backend: Backend
    backend_name: str
    orchestrator: Orchestrator

    async def world(
        self,
        name: str,
        *,
        wall_clock: int | None = None,
        network: NetworkProfile = NetworkProfile.EGRESS,
    ) -> World:
        """A session whose agent runs on the backend under test (a runtime profile)."""
        world = await new_world(self.stack, f"{name}{new_id()[-5:]}")
        image = None if self.backend_name in {"process", "pool"} else "suzumio-runner:latest"
        profile = RuntimeProfileSpec(
            backend=BackendName(self.backend_name),
            image=image,
            pool="default" if self.backend_name == "pool" else None,
            network=network,
            timeouts=Timeouts(wall_clock_seconds=wall_clock or 600),
        )
        commands = CommandClient(self.stack.nc, self.stack.topology)
        await commands.send(
            SetRuntimeProfile(project_id=world.project_id, name="suite", spec=profile),
            actor="system:test",
        )
        await commands.send(
            UpdateAgent(agent_id=world.agent_id, runtime_profile="suite"), actor="system:test"
        )
        return world

    async def request(self, world: World) -> str:
        return await request_activation(self.stack, world)

    async def story(self, activation_id: str) -> list[str]:
        stream = await self.stack.store.load("activation", activation_id)
        return [e.envelope.type for e in stream.events]

    async def ended(self, activation_id: str, timeout: float = 90) -> list[str]:
        return await eventually(
            lambda: self.story(activation_id),
            lambda types: any(t in TERMINAL for t in types),
            timeout=timeout,
            what=f"the end of {activation_id}",
        )

    async def started(self, activation_id: str) -> None:
        await eventually(
            lambda: self.story(activation_id),
            lambda types: "activation.started" in types,
            timeout=60,
            what="the start",
        )

    async def refused_at_once(self, world: World) -> str:
        """An activation of `world` that fails before anything is launched, not to be
        retried: the reason it gives."""
        calls = len(self.model.requests)
        activation_id = await self.request(world)
        assert await self.ended(activation_id) == ["activation.failed"]
        failed = (await self.stack.store.load("activation", activation_id)).events[-1].data
        assert isinstance(failed, ActivationFailed)
        assert failed.retryable is False
        assert len(self.model.requests) == calls
        assert activation_id not in await self.live_ids()
        return failed.reason

    async def live_ids(self) -> set[str]:
        return {h.activation_id for h in await self.backend.list_live()}


@contextlib.asynccontextmanager
async def harness(
    stack: Stack,
    model: ScriptedModelServer,
    tmp: Path,
    factory: BackendFactory,
    name: str,
    *,
    model_url: str | None = None,
    broker_socket: Path | None = None,
) -> AsyncIterator[Harness]:
    """`model_url`: where the runners call instead of `model` (the bench's no-op model);
    `broker_socket`: the tool-broker's Unix socket (network `none`)."""
    settings = OrchestratorSettings(
        broker_url=stack.url_of("toolbroker"),
        broker_socket=broker_socket,
        model_base_url=f"{model_url or model.url}/v1",
        work_dir=tmp / "sandboxes",
        data_dir=tmp,
        namespace=stack.topology.namespace,
        backends=(BackendName(name),),
    )
    backend = await factory(settings)
    pg = await db.create_pool(stack.database_url, "suite-orchestrator", max_size=4)
    js = stack.nc.jetstream()
    bucket = stack.topology.bucket(ARTIFACTS_BUCKET)
    objects = await ensure_object_store(js, bucket)
    orchestrator = Orchestrator(
        stack.nc,
        stack.topology,
        stack.store,
        stack.database_url,
        Planner(
            stack.store,
            TokenSigner([stack.secret_key]),
            SecretBox([stack.secret_key]),
            settings,
            stack.topology.namespace,
        ),
        {name: backend},
        ArtifactCollector(
            js,
            objects,
            bucket,
            pg,
            CommandClient(stack.nc, stack.topology),
            max_bytes=1 << 20,
            max_files=10,
        ),  # fmt: skip
        retention_hours=1,
    )
    stop = asyncio.Event()
    task = asyncio.create_task(orchestrator.run(stop))
    try:
        await eventually(
            lambda: asyncio.sleep(0, orchestrator.leading), bool, timeout=30, what="leading"
        )
        yield Harness(stack, model, backend, name, orchestrator)
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
        await orchestrator.close()
        await pg.close()


# -- the scenarios: each backend's module calls these -------------------------------------------
async def answers_and_ends_completed(h: Harness) -> None:
    """And the session's next activation too (on the pool with warm sessions: on the runner
    the first one left, with its token and its answer, not the first one's)."""
    world = await h.world("ans")
    ended: set[str] = set()
    for answer in ("the suite's answer", "the next answer"):
        h.model.script([Reply.text(answer)])
        activation_id = await h.request(world)
        story = await h.ended(activation_id)
        assert story[0] == "activation.started", story
        assert story[-2:] == ["activation.output_recorded", "activation.completed"], story
        stream = await h.stack.store.load("activation", activation_id)
        assert stream.events[-1].data.text == answer  # type: ignore[attr-defined]
        assert stream.events[-1].data.exit_code == 0  # type: ignore[attr-defined]
        ended.add(activation_id)
    await eventually(h.live_ids, lambda ids: not ended & ids, what="cleanup")


async def crash_with_nonzero_exit_fails(h: Harness) -> None:
    world = await h.world("crash")
    h.model.script([Reply.content_policy()])  # the runner exits 11 (refused for good)
    activation_id = await h.request(world)
    story = await h.ended(activation_id)
    assert story[-1] == "activation.failed", story
    stream = await h.stack.store.load("activation", activation_id)
    ended = stream.events[-1].data
    assert (ended.exit_code, ended.retryable) == (11, False)  # type: ignore[attr-defined]
    await eventually(h.live_ids, lambda ids: activation_id not in ids, what="cleanup")


async def cancel_kills_the_sandbox(h: Harness) -> None:
    world = await h.world("cancel")
    h.model.script([Reply.text("never in time", delay=60)])
    activation_id = await h.request(world)
    await h.started(activation_id)
    # Listed while it runs: else the cleanup check below could pass on a backend that lists
    # nothing at all.
    await eventually(h.live_ids, lambda ids: activation_id in ids, what="the sandbox listed")
    await h.stack.store.append_next(
        world.session_id,
        [ActivationCancelRequested(activation_id=activation_id, reason="test")],
        EventMeta(actor="system:scheduler"),
    )
    story = await h.ended(activation_id, timeout=60)
    assert story.count("activation.cancelled") == 1, story
    assert [t for t in story if t in TERMINAL] == ["activation.cancelled"], story
    await eventually(h.live_ids, lambda ids: activation_id not in ids, what="cleanup")


async def wall_clock_timeout_ends_timed_out(h: Harness) -> None:
    world = await h.world("slow", wall_clock=3)
    h.model.script([Reply.text("too late", delay=60)])
    activation_id = await h.request(world)
    story = await h.ended(activation_id, timeout=60)
    assert [t for t in story if t in TERMINAL] == ["activation.timed_out"], story
    await eventually(h.live_ids, lambda ids: activation_id not in ids, what="cleanup")


async def session_files_go_in_and_come_out(h: Harness) -> None:
    """An artifact of the session is in `/workspace/in` at its path; a file the activation
    leaves in `/workspace/out` becomes an artifact of the session, byte for byte — wherever
    the sandbox ran (the pool's worker and the kubernetes runner share no disk with this)."""
    world = await h.world("files")
    await upload_artifact(h.stack, world, "notes/brief.md", b"# the brief: ship it\n")
    async with h.stack.client(world.key) as c:
        await eventually(
            lambda: c.get(f"/v1/projects/{world.project_id}/artifacts"),
            lambda r: len(r.json()["items"]) == 1,
            what="the upload in the projection",
        )
    h.model.script(
        [
            Reply.tool_calls([ToolCall("file_read", {"path": "in/notes/brief.md"})]),
            Reply.tool_calls(
                [ToolCall("file_write", {"path": "out/report/done.txt", "content": "shipped"})]
            ),
            Reply.text("filed"),
        ]
    )
    seen = len(h.model.requests)
    activation_id = await h.request(world)
    story = await h.ended(activation_id)
    assert story[-1] == "activation.completed", story
    results = [
        str(m.get("content"))
        for r in h.model.requests[seen:]
        if world.session_id in str(r.messages[0])
        for m in r.messages
        if m.get("role") == "tool"
    ]
    assert results, "no tool result reached the model"
    assert "# the brief: ship it" in results[0], results
    async with h.stack.client(world.key) as c:
        listed = await eventually(
            lambda: c.get(f"/v1/projects/{world.project_id}/artifacts"),
            lambda r: any(a["path"] == "report/done.txt" for a in r.json()["items"]),
            what="the out/ file as an artifact",
        )
    [out] = [a for a in listed.json()["items"] if a["path"] == "report/done.txt"]
    assert (out["source"], out["session_id"]) == ("activation", world.session_id)
    assert (out["sha256"], out["size"]) == (hashlib.sha256(b"shipped").hexdigest(), 7)


SCENARIOS = (
    answers_and_ends_completed,
    crash_with_nonzero_exit_fails,
    cancel_kills_the_sandbox,
    wall_clock_timeout_ends_timed_out,
    session_files_go_in_and_come_out,
)
