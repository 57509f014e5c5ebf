"""The orchestrator plans from the agents, projects and session files it folds while following
the log: a plan sees its agent exactly as it was when the request was stored, and its session's
files even where the projection lags behind; a request for an agent the log does not know (or
whose profile cuts its runner off the network) fails at once, without a launch (process
backend, real services)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import asyncpg

from suzumio.contracts.commands import UpdateAgent
from suzumio.contracts.envelope import EventMeta
from suzumio.contracts.events import ActivationFailed, ActivationRequested, RuntimeProfileSet
from suzumio.contracts.ids import new_id
from suzumio.contracts.values import Backend as BackendName
from suzumio.contracts.values import NetworkProfile, RuntimeProfileSpec
from suzumio.orchestrator.backends.base import Backend
from suzumio.orchestrator.backends.process import ProcessBackend
from suzumio.orchestrator.settings import OrchestratorSettings
from suzumio.platform.bus.commands import CommandClient
from suzumio.testing.model_server import Reply, ScriptedModelServer, ToolCall
from tests.backend_suite import harness
from tests.e2e.api import upload_artifact
from tests.e2e.stack import Stack
from tests.support import eventually


async def process_backend(settings: OrchestratorSettings) -> Backend:
    return ProcessBackend(settings.sandboxes())


async def test_a_plan_sees_the_agent_as_it_was_when_requested(
    platform: Stack, model: ScriptedModelServer, tmp_path: Path
) -> None:
    commands = CommandClient(platform.nc, platform.topology)
    async with harness(platform, model, tmp_path, process_backend, "process") as h:
        world = await h.world("asof")
        await commands.send(
            UpdateAgent(agent_id=world.agent_id, prompt="Prompt-before-the-request"),
            actor="system:test",
        )
        model.script([Reply.text("done")])
        activation_id = await h.request(world)
        # Stored right after the request: whenever the plan is made, it must not see this.
        await commands.send(
            UpdateAgent(agent_id=world.agent_id, prompt="Prompt-after-the-request"),
            actor="system:test",
        )
        story = await h.ended(activation_id)
        assert story[-1] == "activation.completed", story
        [request] = [r for r in model.requests if world.session_id in str(r.messages[0])]
        system = str(request.messages[0])
        assert "Prompt-before-the-request" in system
        assert "Prompt-after-the-request" not in system

        # The next request is planned with the update.
        model.script([Reply.text("again")])
        second = await h.request(world)
        assert (await h.ended(second))[-1] == "activation.completed"
        later = [r for r in model.requests if world.session_id in str(r.messages[0])][-1]
        assert "Prompt-after-the-request" in str(later.messages[0])


async def test_a_plan_finds_the_sessions_files_the_projection_has_not_caught_up_with(
    platform: Stack, model: ScriptedModelServer, tmp_path: Path
) -> None:
    """The session's artifacts come from the log the orchestrator folds, so a file stored
    before the request is in `in/` even if the projection lags behind it — as the previous
    activation's outputs, stored just before its end, must be for the next one. The lag is
    simulated: the file's row is taken out of the projection."""
    async with harness(platform, model, tmp_path, process_backend, "process") as h:
        world = await h.world("fold")
        await upload_artifact(platform, world, "brief.md", b"from the log\n")
        async with platform.client(world.key) as c:
            await eventually(
                lambda: c.get(f"/v1/projects/{world.project_id}/artifacts"),
                lambda r: len(r.json()["items"]) == 1,
                what="the upload in the projection",
            )
        db = await asyncpg.connect(platform.database_url)
        try:
            await db.execute(
                "DELETE FROM proj_artifacts.artifacts WHERE session_id = $1", world.session_id
            )
        finally:
            await db.close()
        model.script(
            [Reply.tool_calls([ToolCall("file_read", {"path": "in/brief.md"})]), Reply.text("ok")]
        )
        seen = len(model.requests)
        activation_id = await h.request(world)
        story = await h.ended(activation_id)
        assert story[-1] == "activation.completed", story
        results = [
            str(m.get("content"))
            for r in model.requests[seen:]
            for m in r.messages
            if m.get("role") == "tool"
        ]
        assert any("from the log" in r for r in results), results


async def test_a_request_for_an_unknown_agent_fails_without_a_launch(
    platform: Stack, model: ScriptedModelServer, tmp_path: Path
) -> None:
    async with harness(platform, model, tmp_path, process_backend, "process") as h:
        world = dataclasses.replace(await h.world("ghost"), agent_id=new_id())
        calls = len(model.requests)
        activation_id = new_id()
        await platform.store.append_next(
            world.session_id,
            [
                ActivationRequested(
                    activation_id=activation_id, agent_id=world.agent_id, signal_ids=()
                )
            ],
            EventMeta(actor="system:scheduler"),
        )
        assert await h.ended(activation_id) == ["activation.failed"]
        stream = await platform.store.load("activation", activation_id)
        failed = stream.events[-1].data
        assert isinstance(failed, ActivationFailed)
        assert "does not exist" in failed.reason
        assert failed.retryable is False
        assert activation_id not in await h.live_ids()
        assert len(model.requests) == calls


async def test_a_profile_without_network_stored_earlier_fails_without_a_launch(
    platform: Stack, model: ScriptedModelServer, tmp_path: Path
) -> None:
    """`none` is refused on the pool backend when a profile is set now; one stored before
    that would cut the runner off from the broker and the model, so its activations fail at
    once, not retried."""
    async with harness(platform, model, tmp_path, process_backend, "process") as h:
        world = await h.world("offline")
        offline = RuntimeProfileSpec(
            backend=BackendName.POOL, pool="default", network=NetworkProfile.NONE
        )
        await platform.store.append_next(
            world.project_id,
            [RuntimeProfileSet(name="suite", spec=offline)],  # the agent's profile
            EventMeta(actor="system:test"),
        )
        assert "network 'none' needs the docker backend" in await h.refused_at_once(world)
