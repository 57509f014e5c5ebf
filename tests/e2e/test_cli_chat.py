"""`suzumio chat SESSION TEXT` against the real platform (session, scheduler, orchestrator on
the process backend, tool-broker, gateway), with the scripted model (a fake OpenAI-compatible
provider): the message is sent, the agent's answer printed as it is written with a line for
its tool call, and the exit code says whether the message's work completed. And a whole
conversation through the CLI: a project, an agent and a session made, a chat, the history."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from typing import Any

import pytest

from suzumio.cli import chat
from suzumio.contracts.ids import new_id
from suzumio.testing.model_server import Reply, ScriptedModelServer, ToolCall
from tests.e2e.api import World, new_user, new_world, ok, read_models_held
from tests.e2e.faulty_link import FaultyLink, Rule
from tests.e2e.stack import Stack
from tests.e2e.test_cli_agents import cli
from tests.support import eventually


@pytest.fixture
def stack(everything_on_process: Stack) -> Stack:
    return everything_on_process


@pytest.fixture
def scripted(scripted_model: ScriptedModelServer) -> ScriptedModelServer:
    return scripted_model


async def test_chat_prints_the_answer_and_its_tool_call(
    stack: Stack, scripted: ScriptedModelServer
) -> None:
    world = await new_world(stack, "chat")
    marker = f"ran-{new_id()[-8:]}"
    scripted.script(
        [
            Reply.tool_calls([ToolCall("shell_exec", {"command": f"echo {marker}"})]),
            Reply.text(f"The command printed {marker}."),
        ]
    )

    said = await cli(stack, world.key, "chat", world.session_id, "run the command")

    assert said.returncode == 0, said.stdout + said.stderr
    lines = said.stdout.splitlines()
    assert "· shell.exec" in lines, said.stdout
    assert lines[-1] == f"The command printed {marker}.", said.stdout
    assert lines.index("· shell.exec") < len(lines) - 1  # the call came before the answer
    # The model saw the message, and its answer is the session's history.
    assert scripted.requests[-1].json["messages"][1]["content"].endswith("run the command")
    async with stack.client(world.key) as c:
        items = ok(await c.get(f"/v1/sessions/{world.session_id}/messages"))["items"]
    assert items[-1]["role"] == "assistant"
    assert items[-1]["text"] == f"The command printed {marker}."


async def test_chat_says_when_the_work_failed_for_good(
    stack: Stack, scripted: ScriptedModelServer
) -> None:
    """The provider refuses the key (not retryable): the signal is closed `failed`, and the
    command says so and exits 1 — it does not wait for its timeout."""
    world = await new_world(stack, "chat-refused")
    async with stack.client(world.key) as c:
        spec = {"name": "refused", "role": "refused", "model": {"name": "refusing-model"}}
        agent = ok(await c.post(f"/v1/projects/{world.project_id}/agents", json=spec), 201)
        path = f"/v1/projects/{world.project_id}/sessions"
        session = ok(await c.post(path, json={"agent_id": agent["id"]}), 201)
    refused = '{"error": {"message": "the key was revoked", "type": "invalid_request_error"}}'
    # Its own queue: what the runner does not ask for (a refreshed key's retry) stays there.
    scripted.script([Reply.error(401, refused) for _ in range(3)], model="refusing-model")

    said = await cli(stack, world.key, "chat", session["id"], "hello", "--timeout", "50")

    assert said.returncode == 1, said.stdout + said.stderr
    assert "the message's work ended failed:" in said.stdout, said.stdout
    assert "no answer within" not in said.stdout


async def test_chat_refusals_are_one_line(stack: Stack) -> None:
    world = await new_world(stack, "chat-refusals")

    missing = await cli(stack, world.key, "chat", new_id(), "hello")
    assert missing.returncode == 1, missing
    assert "404: session not found" in missing.stderr.splitlines(), missing.stderr
    assert missing.stdout == ""

    empty = await cli(stack, world.key, "chat", world.session_id, "")
    assert empty.returncode == 1, empty
    assert any(line.startswith("422: ") for line in empty.stderr.splitlines()), empty.stderr

    sent = await cli(stack, world.key, "chat", world.session_id, "later", "--no-wait")
    assert sent.returncode == 0, sent
    assert sent.stdout.startswith("message sent (signal "), sent.stdout


async def test_a_whole_conversation_through_the_cli(
    stack: Stack, scripted: ScriptedModelServer
) -> None:
    key, _ = await new_user(stack, "cli-conversation")

    async def ok_line(*args: str) -> str:
        said = await cli(stack, key, *args)
        assert said.returncode == 0, said.stdout + said.stderr
        lines = said.stdout.splitlines()
        assert len(lines) == 1, said.stdout
        [line] = lines
        return line

    project = await ok_line("projects", "create", "cli demo")
    agent = await ok_line("agents", "create", project, "writer", "--model", "writer-model")
    session = await ok_line("sessions", "create", project, "--agent", agent, "--title", "t")
    async with stack.client(key) as c:
        made = ok(await c.get(f"/v1/agents/{agent}"))
        assert (made["project_id"], made["role"], made["model"]["name"]) == (
            project,
            "writer",
            "writer-model",
        )
        assert ok(await c.get(f"/v1/sessions/{session}"))["agent_id"] == agent

    scripted.script([Reply.text("Hello from the writer.")], model="writer-model")
    assert (await ok_line("chat", session, "hi")) == "Hello from the writer."
    history = await cli(stack, key, "sessions", "history", session)
    assert history.returncode == 0, history.stdout + history.stderr
    assert history.stdout.splitlines()[-2:] == ["user: hi", "assistant: Hello from the writer."]

    # Refusals: one line each, exit 1, nothing made.
    for args, expected in (
        (("agents", "create", new_id(), "x", "--model", "demo"), "404: project not found"),
        (("sessions", "create", project, "--agent", new_id()), "404: agent not found"),
        (("sessions", "history", new_id()), "404: session not found"),
        (("projects", "create", ""), "422: "),
    ):
        said = await cli(stack, key, *args)
        assert said.returncode == 1, (args, said)
        assert said.stdout == "", (args, said.stdout)  # `X=$(suzumio ...)` takes no refusal
        assert any(line.startswith(expected) for line in said.stderr.splitlines()), (args, said)


async def cli_with_stdin(
    stack: Stack, key: str, stdin: str, *args: str
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SUZUMIO_API_URL": stack.api, "SUZUMIO_API_KEY": key, "COLUMNS": "200"}
    return await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "suzumio.cli", *args],
        env=env, input=stdin, capture_output=True, text=True, timeout=90, check=False,
    )  # fmt: skip


async def asking_agent(stack: Stack, world: World, model: str, **agent: Any) -> str:
    """A session of a new agent of the world's project whose `shell.exec` needs an approval;
    its id."""
    async with stack.client(world.key) as c:
        spec = {"name": model, "role": "r", "model": {"name": model}}
        spec |= {"permissions": {"shell.exec": "ask"}, **agent}
        made = ok(await c.post(f"/v1/projects/{world.project_id}/agents", json=spec), 201)
        path = f"/v1/projects/{world.project_id}/sessions"
        return str(ok(await c.post(path, json={"agent_id": made["id"]}), 201)["id"])


async def test_chat_asks_for_an_approval_and_sends_the_answer(
    stack: Stack, scripted: ScriptedModelServer
) -> None:
    """Interactive (here `--interactive`, stdin a pipe): the approval the `ask` policy makes
    is shown, the answer typed is sent, and the approved call runs in the same activation."""
    world = await new_world(stack, "chat-approver")
    session = await asking_agent(stack, world, "approving-model")
    marker = f"approved-{new_id()[-8:]}"
    scripted.script(
        [
            Reply.tool_calls([ToolCall("shell_exec", {"command": f"echo {marker}"})]),
            Reply.text("Ran it."),
        ],
        model="approving-model",
    )

    said = await cli_with_stdin(
        stack, world.key, "maybe\ny\n", "chat", session, "run it", "--interactive"
    )

    assert said.returncode == 0, said.stdout + said.stderr
    lines = said.stdout.splitlines()
    assert any(line.startswith("? approve: ") for line in lines), said.stdout
    assert "  approve? [y/n]   approve? [y/n]   answered" in lines, said.stdout  # asked again
    assert lines[-1] == "Ran it.", said.stdout
    # Its own model's last call: the shared server also answers the module's other sessions
    # (the refusals test's "later", sent without waiting, may be answered meanwhile).
    [*_, ours] = [r for r in scripted.completion_requests if r.model == "approving-model"]
    last = ours.json["messages"][-1]
    assert last["role"] == "tool", last
    assert marker in last["content"], last


async def test_chat_says_how_to_reply_and_exits_waiting_then_the_reply_goes_on(
    stack: Stack, scripted: ScriptedModelServer
) -> None:
    """Not interactive, and nobody approves within the profile's wait: the approval and how
    to reply are said, and the chat exits 3 (waiting). `suzumio pending` lists and answers
    it; the next activation runs the approved call."""
    world = await new_world(stack, "chat-waiter")
    async with stack.client(world.key) as c:
        profile = {"backend": "process", "loop": {"approval_wait_seconds": 1}}
        ok(await c.put(f"/v1/projects/{world.project_id}/runtime-profiles/quick", json=profile))
    session = await asking_agent(stack, world, "waiting-model", runtime_profile="quick")
    call = Reply.tool_calls([ToolCall("shell_exec", {"command": "echo later"})])
    scripted.script([call, call, Reply.text("Done after the approval.")], model="waiting-model")

    said = await cli(stack, world.key, "chat", session, "run it", "--no-interactive")

    assert said.returncode == 3, said.stdout + said.stderr
    assert "[the agent waits for an answer;" in said.stdout, said.stdout
    [hint] = [line for line in said.stdout.splitlines() if line.startswith("  reply: ")]
    assert hint.endswith("--approve (or --deny)"), hint
    action_id = hint.split()[4]
    listed = await cli(stack, world.key, "pending", "list", session)
    assert listed.stdout.startswith(f"{action_id} open ? approve: "), listed.stdout

    replied = await cli(stack, world.key, "pending", "reply", action_id, "--approve")
    assert replied.returncode == 0, replied.stdout + replied.stderr
    assert replied.stdout.strip() == f"{action_id} answered"
    history = await eventually(
        lambda: cli(stack, world.key, "sessions", "history", session),
        lambda done: "assistant: Done after the approval." in done.stdout,
        timeout=60,
        what="the next activation's answer",
    )
    assert history.returncode == 0

    for args, code, expected in (
        (("pending", "reply", action_id), 2, "error: say what"),
        (("pending", "reply", new_id(), "--approve"), 1, "404: "),
        (("pending", "reply", action_id, "--deny"), 1, "409: "),
    ):
        done = await cli(stack, world.key, *args)
        assert done.returncode == code, (args, done)
        assert expected in done.stdout + done.stderr, (args, done)


async def test_a_message_whose_answer_was_lost_is_sent_again_and_lands_once(
    stack: Stack, scripted: ScriptedModelServer
) -> None:
    """The gateway took the message, its 201 was lost on the way back (a relay closes the
    connection): the CLI sends it again under the same Idempotency-Key, gets the first
    answer, and follows the work — one message in the session, not two, and no error."""
    world = await new_world(stack, "chat-lost")
    # Its own model's queue: what other tests' activations ask for is not taken from it.
    session_id = await asking_agent(stack, world, "lost-answer-model", permissions={})
    scripted.script([Reply.text("Heard you once.")], model="lost-answer-model")
    lose = Rule("lose_answer", b"POST /v1/sessions/", b"/messages")
    async with FaultyLink.running(stack.api, lose) as link:
        said = await cli(stack, world.key, "chat", "--api", link.url, session_id, "hello")

    assert lose.hits == 1
    assert said.returncode == 0, said.stdout + said.stderr
    assert said.stdout.splitlines()[-1] == "Heard you once.", said.stdout
    async with stack.client(world.key) as c:
        items = ok(await c.get(f"/v1/sessions/{session_id}/messages"))["items"]
    assert [i["text"] for i in items if i["role"] == "user"] == ["hello"]


async def test_a_stream_gone_silent_is_read_again_from_its_cursor(
    stack: Stack,
    scripted: ScriptedModelServer,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The timeline's connection goes silent without being closed (no keep-alive comes, no
    reset ever will): the chat takes it for cut off after a silence three keep-alives long
    (3 s here) and reads the timeline again from its cursor, instead of waiting out its
    --timeout."""
    world = await new_world(stack, "chat-silent")
    session_id = await asking_agent(stack, world, "silent-stream-model", permissions={})
    scripted.script([Reply.text("Still here.")], model="silent-stream-model")
    async with stack.client(world.key) as c:
        posted = ok(await c.post(f"/v1/sessions/{session_id}/messages", json={"text": "hi"}), 201)
    monkeypatch.setattr(chat, "SILENT_STREAM_SECONDS", 3.0, raising=False)
    silent = Rule("go_silent", b"GET /v1/sessions/", b"/stream")
    conversation = chat.Conversation(session_id, posted["signal_id"])
    headers = {"Authorization": f"Bearer {world.key}"}
    async with FaultyLink.running(stack.api, silent) as link:
        code = await chat.follow(link.url, headers, posted["position"], conversation, 40)

    assert silent.hits == 1
    assert code == 0, capsys.readouterr()
    assert "Still here." in capsys.readouterr().out


async def test_a_command_is_sent_again_after_a_proxys_503(stack: Stack) -> None:
    """A proxy answered 503 (the gateway restarting): the command is sent again a moment
    later, not refused — and is done once."""
    world = await new_world(stack, "cli-503")
    name = f"made-once-{new_id()[-8:]}"
    refused = Rule("proxy_503", b"POST /v1/projects")
    async with FaultyLink.running(stack.api, refused) as link:
        said = await cli(stack, world.key, "projects", "create", name, "--api", link.url)

    assert refused.hits == 1
    assert said.returncode == 0, said.stdout + said.stderr
    async with stack.client(world.key) as c:
        listed = ok(await c.get("/v1/projects", params={"limit": 200}))["items"]
    assert [p["id"] for p in listed if p["name"] == name] == [said.stdout.strip()]


async def test_a_poll_that_cannot_reach_the_gateway_is_asked_again(
    stack: Stack, scripted: ScriptedModelServer
) -> None:
    """While the answer streams, the reads of the activation's state lose their connection
    (a gateway restarting): they are asked again at the next poll, and the chat ends as its
    work did — not with "could not follow the answer"."""
    world = await new_world(stack, "chat-poll-cut")
    session_id = await asking_agent(stack, world, "poll-cut-model", permissions={})
    scripted.script([Reply.text("Through the restart.")], model="poll-cut-model")
    cut = Rule("lose_answer", b"GET /v1/activations/", times=3)
    async with FaultyLink.running(stack.api, cut) as link:
        said = await cli(stack, world.key, "chat", "--api", link.url, session_id, "hello")

    assert cut.hits >= 1
    assert said.returncode == 0, said.stdout + said.stderr
    assert said.stdout.splitlines()[-1] == "Through the restart.", said.stdout


async def test_a_prompt_whose_approval_is_given_elsewhere_stops_waiting_for_typing(
    stack: Stack, scripted: ScriptedModelServer
) -> None:
    """Interactive, the prompt waits for a line that never comes (stdin open, nobody types)
    while the approval is given elsewhere (the API): the chat says so and follows the work
    to its end, instead of waiting out its --timeout and exiting as failed."""
    world = await new_world(stack, "chat-elsewhere")
    session = await asking_agent(stack, world, "elsewhere-model")
    scripted.script(
        [
            Reply.tool_calls([ToolCall("shell_exec", {"command": "echo elsewhere"})]),
            Reply.text("Ran it after all."),
        ],
        model="elsewhere-model",
    )
    env = {**os.environ, "SUZUMIO_API_URL": stack.api, "SUZUMIO_API_KEY": world.key,
           "COLUMNS": "200"}  # fmt: skip
    chatting = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "suzumio.cli", "chat", session, "run it", "--interactive",
        "--timeout", "60",
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
    )  # fmt: skip
    try:
        async with stack.client(world.key) as c:
            path = f"/v1/sessions/{session}/pending-actions"
            [action] = await _open_actions_of(c, path)
            await asyncio.sleep(1.5)  # the chat shows its prompt
            reply = {"approved": True}
            ok(await c.post(f"/v1/pending-actions/{action['id']}/reply", json=reply))
        out, err = await asyncio.wait_for(chatting.communicate(), 90)
    finally:
        if chatting.returncode is None:
            chatting.kill()
            await chatting.wait()

    said = out.decode()
    assert chatting.returncode == 0, said + err.decode()
    # The answer streams on while the prompt waits (its text may follow the prompt).
    assert "Ran it after all." in said, said
    assert "  answered elsewhere, or no longer open" in said.splitlines(), said


async def _open_actions_of(c: Any, path: str) -> list[dict[str, Any]]:
    response = await eventually(
        lambda: c.get(path, params={"status": "open"}),
        lambda r: r.status_code == 200 and len(r.json()["items"]) == 1,
        timeout=60,
        what="the approval asked for",
    )
    return list(response.json()["items"])


async def test_an_answer_the_question_refuses_is_asked_for_again(
    stack: Stack, scripted: ScriptedModelServer
) -> None:
    """The question offers options and the answer typed is none of them: the gateway's
    refusal is shown and the question asked again, and the next answer goes through."""
    world = await new_world(stack, "chat-reask")
    session = await asking_agent(stack, world, "reask-model", permissions={})
    ask = ToolCall("ask_user", {"question": "Which colour?", "options": ["red", "blue"]})
    scripted.script([Reply.tool_calls([ask]), Reply.text("Red it is.")], model="reask-model")

    said = await cli_with_stdin(
        stack, world.key, "green\nred\n", "chat", session, "pick", "--interactive"
    )

    assert said.returncode == 0, said.stdout + said.stderr
    lines = said.stdout.splitlines()
    assert sum(line.startswith("? ") for line in lines) == 2, said.stdout  # asked twice
    assert any("the answer must be one of" in line for line in lines), said.stdout
    assert "  your answer:   answered" in lines, said.stdout
    assert lines[-1] == "Red it is.", said.stdout
    [*_, ours] = [r for r in scripted.completion_requests if r.model == "reask-model"]
    assert "red" in ours.json["messages"][-1]["content"], ours.json["messages"][-1]


async def test_a_create_the_read_models_lag_behind_prints_what_it_made(stack: Stack) -> None:
    """The project is made but the read models stand still (the projector's checkpoint held
    here), so the gateway answers 504 with the new project's `Location`: the command prints
    its id and exits 0 — run again it would make a second project — and says it may take a
    moment to show."""
    world = await new_world(stack, "cli-lagging")
    name = f"made-late-{new_id()[-8:]}"
    async with read_models_held(stack):
        said = await cli(stack, world.key, "projects", "create", name)

    assert said.returncode == 0, said.stdout + said.stderr
    assert "the project was made; the API may take a moment to show it" in said.stderr
    async with stack.client(world.key) as c:
        made = ok(await c.get(f"/v1/projects/{said.stdout.strip()}"))
    assert made["name"] == name
