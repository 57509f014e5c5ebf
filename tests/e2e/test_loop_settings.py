"""The agent loop's settings through the platform: a runtime profile's `loop` section and a
model's window and output cap are accepted by the REST API and agent packages (bad values:
422, nothing stored), and the orchestrator's plan carries them into the runner, whose loop
then keeps to them (process backend, real services; the model is the scripted model server,
the one allowed fake)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from suzumio.contracts.events import ActivationOutputRecorded
from suzumio.orchestrator.backends.base import Backend
from suzumio.orchestrator.backends.process import ProcessBackend
from suzumio.orchestrator.settings import OrchestratorSettings
from suzumio.testing.model_server import Reply, ScriptedModelServer, ToolCall
from tests.backend_suite import harness
from tests.e2e.api import new_world, ok, problem, tar_gz
from tests.e2e.stack import Stack

PROFILE: dict[str, Any] = {"backend": "process", "timeouts": {"wall_clock_seconds": 600}}


async def process_backend(settings: OrchestratorSettings) -> Backend:
    return ProcessBackend(settings.sandboxes())


async def test_loop_settings_and_model_figures_are_checked_at_the_api(platform: Stack) -> None:
    world = await new_world(platform, "loopy")
    profiles = f"/v1/projects/{world.project_id}/runtime-profiles"
    loop = {
        "max_model_calls": 20,
        "max_parallel_tools": 4,
        "tool_timeout_seconds": 900,
        "broker_retries": 8,
    }
    async with platform.client(world.key) as c:
        for bad in (
            {"max_model_calls": 0},
            {"max_parallel_tools": 1_000},
            {"tool_timeout_seconds": -1},
            {"ask_wait_seconds": 301},
            {"broker_retries": 21},
            {"max_model_call": 5},  # a typo
            "fast",
        ):
            problem(await c.put(f"{profiles}/p", json={**PROFILE, "loop": bad}), 422, "invalid")
        problem(await c.get(f"{profiles}/p"), 404, "not_found")  # nothing stored
        saved = ok(await c.put(f"{profiles}/p", json={**PROFILE, "loop": loop}))
        assert saved["spec"]["loop"] == {
            "max_model_calls": 20,
            "max_parallel_tools": 4,
            "tool_timeout_seconds": 900.0,
            "max_retries": None,  # unset: the platform's default
            "broker_retries": 8,
            "ask_wait_seconds": None,
            "approval_wait_seconds": None,
        }
        assert ok(await c.get(f"{profiles}/p"))["spec"]["loop"] == saved["spec"]["loop"]

        agent = f"/v1/agents/{world.agent_id}"
        for model in (
            {"name": "m", "context_window": 10},
            {"name": "m", "max_output_tokens": 0},
            {"name": "m", "context_window": 8_000, "max_output_tokens": 9_000},
            {"name": "m", "window": 8_000},
        ):
            problem(await c.patch(agent, json={"model": model}), 422, "invalid")
            problem(await c.patch(agent, json={"fallbacks": [model]}), 422, "invalid")
        assert ok(await c.get(agent))["model"]["name"] == "demo"  # unchanged
        figures = {"name": "m", "context_window": 32_000, "max_output_tokens": 2_000}
        patched = ok(await c.patch(agent, json={"model": figures, "fallbacks": [figures]}))
        assert patched["model"] == {**figures, "provider": None}
        assert patched["fallbacks"] == [{**figures, "provider": None}]


async def test_an_agent_package_gives_its_models_figures(platform: Stack) -> None:
    world = await new_world(platform, "pkgloop")
    url = f"/v1/projects/{world.project_id}/agents/import"
    manifest = (
        b"name: windowed\nrole: r\n"
        b"model: {name: local-8k, context_window: 8192, max_output_tokens: 1024}\n"
        b"fallbacks: [{name: tiny, context_window: 4096}, plain]\n"
    )
    async with platform.client(world.key) as c:
        agent = ok(
            await c.post(url, files={"package": ("a.tgz", tar_gz({"agent.yaml": manifest}))}), 201
        )
        assert (agent["model"]["context_window"], agent["model"]["max_output_tokens"]) == (
            8_192,
            1_024,
        )
        # Unset figures are left out (the platform's defaults hold).
        assert [m.get("context_window") for m in agent["fallbacks"]] == [4_096, None]
        assert "context_window" not in agent["fallbacks"][1]
        for bad in (
            b"name: x\nrole: r\nmodel: {name: m, context_window: 100}\n",
            b"name: x\nrole: r\nmodel: {name: m, context_window: 4096, max_output_tokens: 4096}\n",
            b"name: x\nrole: r\nmodel: {name: m, max_ouput_tokens: 5}\n",
        ):
            package = tar_gz({"agent.yaml": bad})
            problem(await c.post(url, files={"package": ("a.tgz", package)}), 422, "invalid")
        names = [
            a["name"] for a in ok(await c.get(f"/v1/projects/{world.project_id}/agents"))["items"]
        ]
        assert sorted(names) == ["helper", "windowed"]


async def test_the_plan_carries_the_profiles_loop_and_the_models_cap_to_the_runner(
    platform: Stack, model: ScriptedModelServer, tmp_path: Path
) -> None:
    """A budget of one model call, and a round of 0.5 s with a command allowed 10 s that
    takes 1.5 s: the command finishes (the round never cuts a call short of its own
    timeout), then the budget is spent and the grace call (no tools) ends the activation
    `budget_exhausted`. Every call asks for the model's own output cap."""
    async with harness(platform, model, tmp_path, process_backend, "process") as h:
        world = await h.world("plan")
        loop = {"max_model_calls": 1, "tool_timeout_seconds": 0.5}
        async with platform.client(world.key) as c:
            profiles = f"/v1/projects/{world.project_id}/runtime-profiles"
            ok(await c.put(f"{profiles}/suite", json={**PROFILE, "loop": loop}))
            figures = {"name": "capped", "context_window": 50_000, "max_output_tokens": 1_500}
            ok(await c.patch(f"/v1/agents/{world.agent_id}", json={"model": figures}))
        command = {"command": "sleep 1.5; echo finished-late", "timeout_seconds": 10}
        model.script(
            [
                Reply.tool_calls([ToolCall("shell_exec", command)]),
                Reply.text("where things stand"),
                Reply.text("a call the budget does not allow"),
            ]
        )
        activation_id = await h.request(world)
        story = await h.ended(activation_id)
        assert story[-1] == "activation.completed", story
        stream = await platform.store.load("activation", activation_id)
        [output] = [e.data for e in stream.events if isinstance(e.data, ActivationOutputRecorded)]
        assert (output.reason, output.text) == ("budget_exhausted", "where things stand")
        mine = [r for r in model.completion_requests if world.session_id in str(r.messages[0])]
        assert [r.json["max_tokens"] for r in mine] == [1_500, 1_500]
        assert mine[1].tool_names == []  # the grace call
        [result] = [m for m in mine[1].messages if m.get("role") == "tool"]
        assert "finished-late" in str(result["content"]), result
