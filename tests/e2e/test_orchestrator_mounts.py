"""Mount grants through the real services: refused when granted if they reach the platform's
own directories; checked again when an activation is planned, so a link planted in a granted
path after the grant, or a grant that overlaps this orchestrator's directories, fails the
activation without a launch (process backend; DESIGN.md §10)."""

from __future__ import annotations

import shutil
from pathlib import Path

from suzumio.contracts.commands import UpdateAgent
from suzumio.contracts.ids import new_id
from suzumio.contracts.values import WorkspaceMode
from suzumio.orchestrator.backends.base import Backend
from suzumio.orchestrator.backends.process import ProcessBackend
from suzumio.orchestrator.settings import OrchestratorSettings
from suzumio.platform.bus.commands import CommandClient
from suzumio.testing.model_server import Reply, ScriptedModelServer, ToolCall
from tests.backend_suite import Harness, harness
from tests.e2e.api import World, new_world, ok, problem
from tests.e2e.stack import Stack, running_stack


async def process_backend(settings: OrchestratorSettings) -> Backend:
    return ProcessBackend(settings.sandboxes())


async def mounting_world(h: Harness, granted: Path) -> World:
    """A session whose agent works in `mount` mode with `granted` at /data."""
    world = await h.world("mnt")
    await CommandClient(h.stack.nc, h.stack.topology).send(
        UpdateAgent(agent_id=world.agent_id, workspace_mode=WorkspaceMode.MOUNT),
        actor="system:test",
    )
    async with h.stack.client(world.key) as c:
        ok(
            await c.post(
                f"/v1/projects/{world.project_id}/mount-grants",
                json={"host_path": str(granted), "target": "/data"},
            ),
            201,
        )
    return world


async def test_a_link_planted_in_a_granted_path_fails_the_activation(
    platform: Stack, model: ScriptedModelServer, tmp_path: Path
) -> None:
    granted = platform.mount_root / f"granted-{new_id()}" / "inner"
    granted.mkdir(parents=True)
    (granted / "notes.txt").write_text("granted notes")
    async with harness(platform, model, tmp_path, process_backend, "process") as h:
        world = await mounting_world(h, granted)
        model.script(
            [
                Reply.tool_calls([ToolCall("file_read", {"path": str(granted / "notes.txt")})]),
                Reply.text("read it"),
            ]
        )
        seen = len(model.requests)
        activation_id = await h.request(world)
        assert (await h.ended(activation_id))[-1] == "activation.completed"
        results = [
            str(m.get("content"))
            for r in model.requests[seen:]
            for m in r.messages
            if m.get("role") == "tool"
        ]
        assert any("granted notes" in r for r in results), results

        # Anyone who may write to its parent (an agent with it granted rw) can do this.
        shutil.rmtree(granted)
        granted.symlink_to("/etc")
        reason = await h.refused_at_once(world)
        assert f"mount grant {granted} now resolves to /etc" in reason


async def test_a_grant_overlapping_the_orchestrators_directories_fails_the_activation(
    platform: Stack, model: ScriptedModelServer
) -> None:
    """The session service accepts it (its own data directory is elsewhere); this
    orchestrator's data directory is inside the grant, so its plan refuses it."""
    home = platform.mount_root / f"orchestrator-{new_id()}"
    home.mkdir()
    async with harness(platform, model, home, process_backend, "process") as h:
        world = await mounting_world(h, platform.mount_root)
        reason = await h.refused_at_once(world)
        assert "overlaps the platform's own directory" in reason


async def test_a_grant_of_the_platforms_own_directories_is_refused(
    nats_url: str, postgres_url: str, tmp_path: Path
) -> None:
    """With the whole of `tmp_path` allowed, its data and sandboxes directories still are not
    (every activation's input with its token is there)."""
    home = tmp_path.resolve()
    env = {"SUZUMIO_MOUNT_ROOTS": str(home)}
    async with running_stack(nats_url, postgres_url, home, extra_env=env) as stack:
        data, sandboxes = home / "data", home / "sandboxes"
        for d in (data / "inner", sandboxes / "activations", stack.mount_root / "fine"):
            d.mkdir(parents=True, exist_ok=True)
        (stack.mount_root / "link").symlink_to(sandboxes)
        world = await new_world(stack, "own")
        base = f"/v1/projects/{world.project_id}/mount-grants"
        async with stack.client(world.key) as c:
            for i, path in enumerate(
                (home, data, data / "inner", sandboxes / "activations", stack.mount_root / "link")
            ):
                answer = problem(
                    await c.post(base, json={"host_path": str(path), "target": f"/d{i}"}),
                    403,
                    "forbidden",
                )
                assert "platform's own data or sandboxes directory" in str(answer), answer
            fine = stack.mount_root / "fine"
            grant = ok(await c.post(base, json={"host_path": str(fine), "target": "/d"}), 201)
            assert grant["host_path"] == str(fine)
            assert [g["id"] for g in ok(await c.get(base))] == [grant["id"]]
