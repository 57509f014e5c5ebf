"""Asking a person, end to end: the runner asks through the tool-broker, the question shows
up through the gateway, a reply through the gateway resumes the work — while the activation
waits, or after it checkpointed and ended. Tool permission policy (ask / deny) rides the same
path. Real session, scheduler, tool-broker and gateway processes; a scripted model."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx

from suzumio.contracts.events import ActivationOutputRecorded, CheckpointSaved, ToolCallFinished
from suzumio.contracts.runner import RunnerActivationInput, RunnerConfig
from suzumio.contracts.values import ToolPolicy
from suzumio.platform.tokens import TokenSigner
from suzumio.runner import exits
from suzumio.testing.model_server import Reply, ScriptedModelServer, ToolCall
from tests.e2e.api import World, new_world, ok
from tests.e2e.runner_env import launcher, post
from tests.e2e.stack import Stack
from tests.support import eventually


async def open_question(c: httpx.AsyncClient, world: World) -> dict[str, Any]:
    listed = await eventually(
        lambda: c.get(f"/v1/sessions/{world.session_id}/pending-actions"),
        lambda r: r.status_code == 200 and any(a["status"] == "open" for a in r.json()["items"]),
        timeout=30,
        what="an open pending action",
    )
    [action] = [a for a in listed.json()["items"] if a["status"] == "open"]
    return dict(action)


async def outputs(stack: Stack, activation_id: str) -> list[ActivationOutputRecorded]:
    stream = await stack.store.load("activation", activation_id)
    return [e.data for e in stream.events if isinstance(e.data, ActivationOutputRecorded)]


async def test_ask_user_waits_and_the_reply_resumes_the_same_activation(
    platform: Stack, model: ScriptedModelServer, tmp_path: Path
) -> None:
    world = await new_world(platform, "quinn")
    model.script(
        [
            Reply.tool_calls(
                [ToolCall("ask_user", {"question": "Which colour?", "options": ["red", "blue"]})]
            ),
            Reply.text("Painting it blue."),
        ]
    )
    async with launcher(platform, model, tmp_path, world) as runs:
        await post(platform, world, "paint the shed")
        async with platform.client(world.key) as c:
            action = await open_question(c, world)
            assert action["prompt"] == "Which colour?"
            assert action["options"] == ["red", "blue"]
            ok(await c.post(f"/v1/pending-actions/{action['id']}/reply", json={"answer": "blue"}))
        [run] = await runs.wait_ended(1)
    assert run.exit_code == exits.COMPLETED, run.stderr
    assert len(runs.runs) == 1  # answered while it waited: no second activation
    tool_result = model.requests[1].messages[-1]
    assert (tool_result["role"], tool_result["content"]) == ("tool", "blue")
    [output] = await outputs(platform, run.activation_id)
    assert output.text == "Painting it blue."


async def test_ask_user_checkpoints_ends_and_a_later_reply_resumes(
    platform: Stack, model: ScriptedModelServer, tmp_path: Path
) -> None:
    world = await new_world(platform, "rowan")
    model.script(
        [
            Reply.tool_calls([ToolCall("checkpoint", {"data": {"step": "asked about colour"}})]),
            Reply.tool_calls([ToolCall("ask_user", {"question": "Which colour?"})]),
            Reply.text("(second activation) Painting it green."),
        ]
    )
    config = RunnerConfig(ask_wait_seconds=0)  # do not wait: checkpoint and end
    async with launcher(platform, model, tmp_path, world, config=config) as runs:
        await post(platform, world, "paint the fence")
        [first] = await runs.wait_ended(1)
        assert first.exit_code == exits.WAITING, first.stderr
        [waiting] = await outputs(platform, first.activation_id)
        assert waiting.reason == "waiting"
        async with platform.client(world.key) as c:
            action = await open_question(c, world)
            ok(await c.post(f"/v1/pending-actions/{action['id']}/reply", json={"answer": "green"}))
        ended = await runs.wait_ended(2)
    second = next(r for r in ended if r.activation_id != first.activation_id)
    assert second.exit_code == exits.COMPLETED, second.stderr
    resumed = model.requests[2].messages
    # The new activation sees the history (the question and the stand-in result), the
    # checkpoint in its prompt, and the answer as a new message.
    assert "asked about colour" in resumed[0]["content"]
    assert any(m.get("tool_calls") for m in resumed if m["role"] == "assistant")
    assert resumed[-1]["role"] == "user"
    assert "green" in resumed[-1]["content"]
    [output] = await outputs(platform, second.activation_id)
    assert output.text.endswith("Painting it green.")


def with_policy(**policy: ToolPolicy) -> Any:
    def customise(spec: RunnerActivationInput) -> RunnerActivationInput:
        permissions = {name.replace("_", "."): value for name, value in policy.items()}
        return spec.model_copy(update={"permissions": permissions})

    return customise


async def test_policy_ask_needs_an_approval_and_deny_never_runs(
    platform: Stack, model: ScriptedModelServer, tmp_path: Path
) -> None:
    world = await new_world(platform, "sage")
    model.script(
        [
            Reply.tool_calls(
                [
                    ToolCall("file_write", {"path": "approved.txt", "content": "yes"}),
                    ToolCall("shell_exec", {"command": "touch denied.txt"}),
                ]
            ),
            Reply.text("done as allowed"),
        ]
    )
    policy = with_policy(file_write=ToolPolicy.ASK, shell_exec=ToolPolicy.DENY)
    async with launcher(platform, model, tmp_path, world, customise=policy) as runs:
        await post(platform, world, "write and run")
        async with platform.client(world.key) as c:
            action = await open_question(c, world)
            assert action["kind"] == "approval"
            assert "file.write" in action["prompt"]
            reply = {"answer": "", "approved": True}
            ok(await c.post(f"/v1/pending-actions/{action['id']}/reply", json=reply))
        [run] = await runs.wait_ended(1)
    assert run.exit_code == exits.COMPLETED, run.stderr
    workspace = tmp_path / run.activation_id / "workspace"
    assert (workspace / "approved.txt").read_text() == "yes"
    assert not (workspace / "denied.txt").exists()
    stream = await platform.store.load("activation", run.activation_id)
    statuses = [e.data.status for e in stream.events if isinstance(e.data, ToolCallFinished)]
    assert sorted(statuses) == ["denied", "ok"]


async def test_an_approved_call_of_a_broker_tool_passes_the_brokers_own_check(
    platform: Stack, model: ScriptedModelServer, tmp_path: Path
) -> None:
    """`checkpoint` under `ask`: the broker holds the policy too (the token says so), and lets
    the call through only with the arguments a person approved, which the runner sends."""
    world = await new_world(platform, "sava")
    model.script(
        [
            Reply.tool_calls([ToolCall("checkpoint", {"data": {"step": 2}})]),
            Reply.text("saved"),
        ]
    )
    policy = with_policy(checkpoint=ToolPolicy.ASK)
    async with launcher(platform, model, tmp_path, world, customise=policy) as runs:
        await post(platform, world, "save your place")
        async with platform.client(world.key) as c:
            action = await open_question(c, world)
            assert action["kind"] == "approval"
            reply = {"answer": "", "approved": True}
            ok(await c.post(f"/v1/pending-actions/{action['id']}/reply", json=reply))
        [run] = await runs.wait_ended(1)
    assert run.exit_code == exits.COMPLETED, run.stderr
    stream = await platform.store.load("session", world.session_id)
    [saved] = [e.data for e in stream.events if isinstance(e.data, CheckpointSaved)]
    assert saved.data == {"step": 2}
    activation = await platform.store.load("activation", run.activation_id)
    statuses = [e.data.status for e in activation.events if isinstance(e.data, ToolCallFinished)]
    assert statuses == ["ok"]


async def test_a_call_the_broker_refuses_by_policy_is_the_models_to_hear_not_a_fence(
    platform: Stack, model: ScriptedModelServer, tmp_path: Path
) -> None:
    """The broker holds the agent's policy too; where it refuses a call the runner let through
    (a runner from before, or one whose input says otherwise), the model hears it refused,
    as the tool's result — a 403 was taken for a fenced token (the call failed as broken,
    `FencedError`)."""
    world = await new_world(platform, "refu")
    model.script(
        [
            Reply.tool_calls([ToolCall("checkpoint", {"data": {"step": 2}})]),
            Reply.text("could not save"),
        ]
    )

    def denied_by_the_broker(spec: RunnerActivationInput) -> RunnerActivationInput:
        token = TokenSigner([platform.secret_key]).issue(
            activation_id=spec.activation.id,
            session_id=spec.session.id,
            project_id=spec.project.id,
            agent_id=spec.agent.id,
            ttl=timedelta(minutes=10),
            policies={"checkpoint": ToolPolicy.DENY},
        )
        return spec.model_copy(update={"token": token})

    async with launcher(platform, model, tmp_path, world, customise=denied_by_the_broker) as runs:
        await post(platform, world, "save your place")
        [run] = await runs.wait_ended(1)
    assert run.exit_code == exits.COMPLETED, run.stderr
    activation = await platform.store.load("activation", run.activation_id)
    [finished] = [e.data for e in activation.events if isinstance(e.data, ToolCallFinished)]
    assert finished.status == "error"
    assert finished.error == "refused: checkpoint is denied by this agent's policy"
    stream = await platform.store.load("session", world.session_id)
    assert not [e for e in stream.events if isinstance(e.data, CheckpointSaved)]
