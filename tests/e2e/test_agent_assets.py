"""An agent package's env facts and assets reach its activations, through the real orchestrator
engine, tool-broker and runner (the backend suite's harness), on the process backend and on the
pool backend (a worker with warm sessions: the session's second activation runs in the
workspace the first one left).

The package is imported through the API; the model is scripted. The system prompt the model got
holds the env facts; a shell command of the activation finds the assets under
`/workspace/assets`, read-only, beside the session's own file of the same name in `in/`, which
the asset does not replace. After a package update (new facts, one asset changed, one
dropped, one added), sent for the agent through the API, the session's next activation sees
the new package and nothing of the old.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from suzumio.contracts.commands import SetRuntimeProfile
from suzumio.contracts.ids import new_id
from suzumio.contracts.values import Backend as BackendName
from suzumio.contracts.values import RuntimeProfileSpec, Timeouts
from suzumio.orchestrator.backends.base import Backend
from suzumio.orchestrator.backends.process import ProcessBackend
from suzumio.orchestrator.settings import OrchestratorSettings
from suzumio.platform.bus.commands import CommandClient
from suzumio.testing.model_server import Reply, ScriptedModelServer, ToolCall
from tests.backend_suite import Harness, harness
from tests.e2e.api import World, new_user, ok, problem, tar_gz, upload_artifact
from tests.e2e.stack import Stack
from tests.e2e.test_backend_pool import pool_factory
from tests.e2e.test_broker_access import broker, live
from tests.support import eventually

AGENT_YAML = b"""\
name: packaged
role: release checker
model: demo
runtime_profile: suite
"""
FACTS = b"""\
os: debian 12
python: "3.12"
deploy_host: release.internal
"""
SHELL = (
    'for f in $(cd assets && find . -type f | sort); do echo "ASSET $f: $(cat assets/$f)"; done; '
    'echo "MODE $(stat -c %a assets/notes.md)"; '
    'echo "SESSION $(cat in/notes.md)"'
)


@pytest.fixture
def workers() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        proc.terminate()
    for proc in started:
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def process_backend(settings: OrchestratorSettings) -> Backend:
    return ProcessBackend(settings.sandboxes())


async def packaged_world(h: Harness, name: str) -> World:
    """A project whose agent comes from a package (on the backend under test) and a session
    of it holding a file `notes.md` of its own."""
    stack = h.stack
    key, user_id = await new_user(stack, f"{name}{new_id()[-5:]}")
    async with stack.client(key) as c:
        project = ok(await c.post("/v1/projects", json={"name": "packaged"}), 201)
    image = None if h.backend_name in {"process", "pool"} else "suzumio-runner:latest"
    profile = RuntimeProfileSpec(
        backend=BackendName(h.backend_name),
        image=image,
        pool="default" if h.backend_name == "pool" else None,
        timeouts=Timeouts(wall_clock_seconds=600),
    )
    await CommandClient(stack.nc, stack.topology).send(
        SetRuntimeProfile(project_id=project["id"], name="suite", spec=profile),
        actor="system:test",
    )
    package = tar_gz({
        "checker/agent.yaml": AGENT_YAML,
        "checker/prompt/system.md": b"Check releases.",
        "checker/env/env_facts.yaml": FACTS,
        "checker/notes.md": b"the package's notes",
        "checker/docs/style.md": b"short sentences",
        "checker/old.txt": b"dropped later",
    })  # fmt: skip
    async with stack.client(key) as c:
        agent = ok(
            await c.post(
                f"/v1/projects/{project['id']}/agents/import",
                files={"package": ("checker.tar.gz", package, "application/gzip")},
            ),
            201,
        )
        session = ok(
            await c.post(
                f"/v1/projects/{project['id']}/sessions",
                json={"agent_id": agent["id"], "title": "t"},
            ),
            201,
        )
    world = World(key, user_id, project["id"], agent["id"], session["id"])
    await upload_artifact(stack, world, "notes.md", b"the session's own notes")
    async with stack.client(key) as c:
        await eventually(
            lambda: c.get(f"/v1/projects/{world.project_id}/artifacts"),
            lambda r: len(r.json()["items"]) == 1,
            what="the upload in the projection",
        )
    return world


async def run_once(h: Harness, world: World) -> tuple[str, str]:
    """One activation whose model runs `SHELL`: its system prompt and the command's output."""
    h.model.script(
        [Reply.tool_calls([ToolCall("shell_exec", {"command": SHELL})]), Reply.text("ok")]
    )
    seen = len(h.model.requests)
    activation_id = await h.request(world)
    story = await h.ended(activation_id)
    if story[-1] != "activation.completed":
        ended = (await h.stack.store.load("activation", activation_id)).events[-1].data
        raise AssertionError(f"{story}: {ended}")
    requests = [r for r in h.model.requests[seen:] if world.session_id in str(r.messages[0])]
    assert requests, "no request of the session reached the model"
    system = str(requests[0].messages[0]["content"])
    results = [
        str(m.get("content")) for r in requests for m in r.messages if m.get("role") == "tool"
    ]
    assert results, "no tool result reached the model"
    return system, results[-1]  # the earlier ones are the session's history


async def update_package(h: Harness, world: World) -> None:
    """A new version of the package, sent for the agent: new facts and prompt, one asset
    changed, one kept, one dropped, one added."""
    package = tar_gz({
        "agent.yaml": AGENT_YAML,
        "prompt/system.md": b"Check releases twice.",
        "env/env_facts.yaml": b"os: debian 13\ndeploy_host: release.internal\n",
        "notes.md": b"the package's new notes",
        "docs/style.md": b"short sentences",
        "new/added.txt": b"added in v2",
    })  # fmt: skip
    async with h.stack.client(world.key) as c:
        body: dict[str, Any] = ok(
            await c.post(
                f"/v1/agents/{world.agent_id}/package",
                files={"package": ("v2.tar.gz", package, "application/gzip")},
            )
        )
    assert [a["path"] for a in body["assets"]] == ["docs/style.md", "new/added.txt", "notes.md"]
    assert body["env_facts"] == {"os": "debian 13", "deploy_host": "release.internal"}
    assert (body["prompt"], body["runtime_profile"]) == ("Check releases twice.", "suite")


async def assets_and_facts_reach_the_activation(h: Harness) -> None:
    world = await packaged_world(h, "assets")
    system, shown = await run_once(h, world)
    assert (
        "<env_facts>\n"
        '"deploy_host": "release.internal"\n'
        '"os": "debian 12"\n'
        '"python": "3.12"\n'
        "</env_facts>"
    ) in system, system
    assert "Check releases." in system
    assert "/assets: docs/style.md, notes.md, old.txt." in system, system
    assert "ASSET ./docs/style.md: short sentences" in shown, shown
    assert "ASSET ./notes.md: the package's notes" in shown, shown
    assert "ASSET ./old.txt: dropped later" in shown, shown
    assert "MODE 444" in shown, shown
    assert "SESSION the session's own notes" in shown, shown  # the asset replaced nothing

    await update_package(h, world)
    system, shown = await run_once(h, world)
    assert '"os": "debian 13"' in system, system
    assert "Check releases twice." in system, system
    assert '"python"' not in system, system
    assert '"os": "debian 12"' not in system, system
    assert "ASSET ./notes.md: the package's new notes" in shown, shown
    assert "ASSET ./new/added.txt: added in v2" in shown, shown
    assert "ASSET ./docs/style.md: short sentences" in shown, shown
    assert "old.txt" not in shown, shown
    assert "SESSION the session's own notes" in shown, shown


async def test_on_the_process_backend(
    platform: Stack, model: ScriptedModelServer, tmp_path: Path
) -> None:
    async with harness(platform, model, tmp_path, process_backend, "process") as h:
        await assets_and_facts_reach_the_activation(h)


async def test_on_the_pool_backend_with_a_warm_workspace(
    platform: Stack,
    model: ScriptedModelServer,
    tmp_path: Path,
    workers: list[subprocess.Popen[bytes]],
) -> None:
    factory: Callable[[OrchestratorSettings], Awaitable[Backend]] = pool_factory(
        platform, tmp_path, workers
    )
    async with harness(platform, model, tmp_path, factory, "pool") as h:
        await assets_and_facts_reach_the_activation(h)
    # The second activation ran where the first one left its assets (else nothing was pruned).
    assert '"warm": true' in (tmp_path / "worker.log").read_text()


async def test_a_package_update_is_checked_first_and_replaces_every_setting(
    platform: Stack,
) -> None:
    """A refused package (422) changes nothing of the agent; a valid one replaces all it
    defines — a runtime profile it leaves out is none afterwards."""
    key, _ = await new_user(platform, f"upd{new_id()[-5:]}")
    async with platform.client(key) as c:
        project = ok(await c.post("/v1/projects", json={"name": "p"}), 201)
        ok(await c.put(f"/v1/projects/{project['id']}/runtime-profiles/suite",
                       json={"backend": "process"}))  # fmt: skip
        first = tar_gz({"agent.yaml": AGENT_YAML, "env/env_facts.yaml": FACTS, "a.md": b"a"})
        agent = ok(
            await c.post(
                f"/v1/projects/{project['id']}/agents/import", files={"package": ("p", first)}
            ),
            201,
        )
        url = f"/v1/agents/{agent['id']}/package"
        nested = tar_gz({"agent.yaml": AGENT_YAML, "docs": b"x", "docs/a.md": b"y"})
        for bad in (b"not an archive", tar_gz({"a.md": b"no agent.yaml"}), nested):
            refused = await c.post(url, files={"package": ("p", bad)})
            assert refused.status_code == 422, refused.text
        assert ok(await c.get(f"/v1/agents/{agent['id']}")) == agent
        plain = b"name: plain\nrole: r\nmodel: demo\n"
        body = ok(await c.post(url, files={"package": ("p", tar_gz({"agent.yaml": plain}))}))
    assert (body["name"], body["runtime_profile"]) == ("plain", None)
    assert (body["env_facts"], body["assets"]) == ({}, [])


async def test_the_broker_serves_an_asset_only_to_its_own_agents_activations(
    platform: Stack,
) -> None:
    """By digest, to a token of an agent whose package lists it or once did; any other digest —
    another agent's asset, an artifact's bytes, an unknown one — is 404 alike."""
    mine = await live(platform, "assetmine")
    theirs = await live(platform, "assettheirs")
    data = os.urandom(50_000)
    digest = hashlib.sha256(data).hexdigest()
    plain = b"name: plain\nrole: r\nmodel: demo\n"
    url = f"/v1/agents/{mine.world.agent_id}/package"
    async with platform.client(mine.world.key) as c:
        ok(await c.post(url, files={"package": ("p", tar_gz({"agent.yaml": plain, "a": data}))}))
    artifact = await upload_artifact(platform, mine.world, "x.txt", b"an artifact's bytes")
    async with broker(platform, mine.token) as c:
        got = await c.get(f"/runner/assets/{digest}")
        assert (got.status_code, got.content) == (200, data)
        assert got.headers["content-length"] == str(len(data))
        problem(await c.get(f"/runner/assets/{artifact['sha256']}"), 404, "not_found")
        problem(await c.get(f"/runner/assets/{'0' * 64}"), 404, "not_found")
        assert (await c.get("/runner/assets/not-a-digest")).status_code == 422
    async with broker(platform, theirs.token) as c:
        problem(await c.get(f"/runner/assets/{digest}"), 404, "not_found")
    async with broker(platform, None) as c:
        assert (await c.get(f"/runner/assets/{digest}")).status_code == 401
    async with platform.client(mine.world.key) as c:  # a new version without it
        ok(await c.post(url, files={"package": ("p", tar_gz({"agent.yaml": plain}))}))
    async with broker(platform, mine.token) as c:  # planned before: still its asset
        assert (await c.get(f"/runner/assets/{digest}")).status_code == 200
