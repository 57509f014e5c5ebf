"""The session's log and the runner's conversation order messages differently: a message is
logged when it is posted, while the runner records a tool round's results once the round is
over, and its answer with the final call. A message posted meanwhile must neither end the
round in later activations (its results were dropped for stand-ins) nor look answered by the
answer logged after it (it was skipped as a signal, the conversation ending on the agent's
turn).

The model is the scripted model server (the one allowed fake) through the real openai SDK; the
broker is an `httpx.MockTransport` (tests.unit.loop_support)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from suzumio.contracts.runner import AgentHistoryMessage, SignalSpec, ToolCall
from suzumio.contracts.values import Priority, SignalKind
from suzumio.runner.agent import MAX_ENTRY_BYTES, SENT_WHILE_ANSWERING
from suzumio.runner.context import UNFINISHED, render_history
from suzumio.testing.model_server import Reply
from suzumio.testing.model_server import ToolCall as ModelToolCall
from tests.unit.loop_support import Broker, run_loop, spec

CALLS = (
    ToolCall(id="c1", name="shell.exec", arguments='{"command": "pytest"}'),
    ToolCall(id="c2", name="file.read", arguments='{"path": "a.txt"}'),
)


def entry(id_: str, role: str, content: str = "", **extra: object) -> AgentHistoryMessage:
    return AgentHistoryMessage(id=id_, role=role, content=content, **extra)  # type: ignore[arg-type]


def test_a_message_posted_during_a_tool_round_follows_its_results() -> None:
    history = [
        entry("u1", "user", "run the tests"),
        entry("a1", "assistant", tool_calls=CALLS),
        entry("m1", "user", "also check the docs"),  # posted while the round ran
        entry("r1", "tool", "12 passed", tool_call_id="c1"),
        entry("r2", "tool", "hello", tool_call_id="c2"),
        entry("a2", "assistant", "done"),
    ]
    rendered = render_history(history)
    assert [i for i, _ in rendered] == ["u1", "a1", "r1", "r2", "m1", "a2"]
    assert [m.get("content") for _, m in rendered[2:4]] == ["12 passed", "hello"]


def test_a_round_cut_short_gets_stand_ins_and_then_what_was_posted() -> None:
    history = [
        entry("u1", "user", "run the tests"),
        entry("a1", "assistant", tool_calls=CALLS),
        entry("m1", "user", "hurry"),
        entry("r1", "tool", "12 passed", tool_call_id="c1"),
        # the sandbox died before c2's result; the next entry is the agent's again
        entry("a2", "assistant", "let me look again"),
    ]
    rendered = render_history(history)
    assert [i for i, _ in rendered] == ["u1", "a1", "r1", None, "m1", "a2"]
    assert rendered[3][1] == {"role": "tool", "tool_call_id": "c2", "content": UNFINISHED}


async def first_request(
    tmp_path: Path,
    history: tuple[AgentHistoryMessage, ...],
    signal: SignalSpec,
    answer: str,
    retry: dict[str, object] | None = None,
) -> tuple[str, list[dict[str, object]]]:
    """The activation given `signal` on `history` (`retry`: its attempt and earlier ones):
    how it ended, and what its model was sent."""
    activation = spec(tmp_path, history=history)
    update = {"signals": (signal,), **(retry or {})}
    activation = activation.model_copy(
        update={"activation": activation.activation.model_copy(update=update)}
    )
    run = await run_loop(tmp_path, activation, [Reply.text(answer)])
    return run.ending.reason, list(run.model_requests[0].messages)


def message_signal(signal_id: str, message_id: str, text: str) -> SignalSpec:
    return SignalSpec(
        id=signal_id,
        kind=SignalKind.USER_MESSAGE,
        priority=Priority.P1,
        text=text,
        message_id=message_id,
    )


async def test_a_message_logged_before_the_last_answer_comes_again_at_the_end(
    tmp_path: Path,
) -> None:
    """Posted while the last activation wrote its answer: the log has it before that answer,
    and the activation it wakes was given it as a signal. It was skipped as in the history
    already, and the request ended on the agent's own turn."""
    history = (
        entry("u1", "user", "write the report"),
        entry("m1", "user", "in British spelling, please"),  # during the final model call
        entry("a1", "assistant", "Here is the report."),
    )
    signal = message_signal("sig1", "m1", "in British spelling, please")
    reason, sent = await first_request(tmp_path, history, signal, "Here it is, in British.")
    assert reason == "completed"
    assert sent[-1] == {
        "role": "user",
        "content": f"{SENT_WHILE_ANSWERING} in British spelling, please",
    }

    # At the history's end already (posted after the answer): in its place, not twice.
    tail = (*history, entry("m2", "user", "thanks"))
    _, sent = await first_request(tmp_path, tail, message_signal("sig2", "m2", "thanks"), "ok")
    assert [m["content"] for m in sent if m["role"] == "user"].count("thanks") == 1
    assert sent[-1] == {"role": "user", "content": "thanks"}


async def test_a_retry_does_not_get_its_message_again(tmp_path: Path) -> None:
    """Attempt 1 took the message, called a tool and died; attempt 2 (an activation of its
    own) is given the same signal on a history that has attempt 1's call and result after
    the message. That work is on the message, not an answer to it: the message was pushed
    again at the end as one received meanwhile, and the model read it twice (a request it
    might carry out twice)."""
    history = (
        entry("u0", "user", "hello"),
        entry("a0", "assistant", "Hi.", activation_id="an-earlier-activation"),
        entry("m1", "user", "delete the old branch"),
        entry("a1", "assistant", tool_calls=(CALLS[0],), activation_id="attempt-1"),
        entry("r1", "tool", "done", tool_call_id="c1", activation_id="attempt-1"),
    )
    signal = message_signal("sig1", "m1", "delete the old branch")
    retry = {"attempt": 2, "earlier_attempts": ("attempt-1",)}
    reason, sent = await first_request(tmp_path, history, signal, "The branch is gone.", retry)
    assert reason == "completed"
    users = [m["content"] for m in sent if m["role"] == "user"]
    assert users == ["hello", "delete the old branch"]
    assert sent[-1] == {"role": "tool", "tool_call_id": "c1", "content": "done"}

    # Another activation's answer after the message still sends it again at the end.
    _, sent = await first_request(tmp_path, history, signal, "ok")
    assert sent[-1] == {"role": "user", "content": f"{SENT_WHILE_ANSWERING} delete the old branch"}


async def test_a_retry_after_its_compaction_does_not_get_its_message_again(
    tmp_path: Path,
) -> None:
    """Attempt 1 took the message, worked on it, compacted (the message among the archived
    entries, in the summary now) and died. Attempt 2's history has the summary where the
    message stood: given again at the end, the model read the request twice."""
    history = (
        entry(
            "sum1",
            "user",
            "[Summary of earlier conversation]\nThe user asked to delete the"
            " old branch; the agent listed the branches.",
        ),
        entry("a2", "assistant", tool_calls=(CALLS[0],), activation_id="attempt-1"),
        entry("r2", "tool", "done", tool_call_id="c1", activation_id="attempt-1"),
    )
    signal = message_signal("sig1", "m1", "delete the old branch")
    retry = {
        "attempt": 2,
        "earlier_attempts": ("attempt-1",),
        "summarized_message_ids": ("m1",),
    }
    reason, sent = await first_request(tmp_path, history, signal, "The branch is gone.", retry)
    assert reason == "completed"
    assert not [m for m in sent if m.get("content") == "delete the old branch"]
    assert sent[-1] == {"role": "tool", "tool_call_id": "c1", "content": "done"}

    # Not archived by an earlier attempt's compaction: the message comes at the end.
    retry = {"attempt": 2, "earlier_attempts": ("attempt-1",)}
    _, sent = await first_request(tmp_path, history, signal, "ok", retry)
    assert sent[-1] == {"role": "user", "content": "delete the old branch"}


VLLM_ID = "chatcmpl-tool-" + "0123456789abcdef" * 2  # 46 characters: OpenAI takes 40 at most


def test_a_call_id_a_provider_would_refuse_is_sent_back_as_one_it_takes() -> None:
    """Recorded as a model made it (another model of the chain; before the runner replaced
    such ids): the call and its result under one id every provider takes, each time."""
    calls = (ToolCall(id=VLLM_ID, name="file.read", arguments="{}"), CALLS[1])
    history = [
        entry("u1", "user", "read them"),
        entry("a1", "assistant", tool_calls=calls),
        entry("r1", "tool", "a", tool_call_id=VLLM_ID),  # c2 got no result: a stand-in
        entry("a2", "assistant", "done"),
    ]
    rendered = [m for _, m in render_history(history)]
    sent = [c["id"] for c in rendered[1]["tool_calls"]]
    assert sent[1] == "c2"  # one every provider takes stays as it is
    assert len(sent[0]) <= 40
    assert sent[0].replace("_", "").isalnum()
    assert [m["tool_call_id"] for m in rendered[2:4]] == sent
    assert [m for _, m in render_history(history)] == rendered  # the same every time


async def test_a_call_id_a_provider_would_refuse_is_replaced_as_it_comes(tmp_path: Path) -> None:
    """A vLLM primary's ids, sent back to an OpenAI fallback, failed the conversation for
    good: every later request of the session carried them."""
    replies = [
        Reply.tool_calls([ModelToolCall("file_read", {"path": "a.txt"}, id=VLLM_ID)]),
        Reply.text("read"),
    ]
    run = await run_loop(tmp_path, spec(tmp_path), replies)
    assert run.ending.reason == "completed"
    sent = list(run.model_requests[1].messages)
    [call] = next(m for m in sent if m.get("tool_calls"))["tool_calls"]
    assert call["id"] != VLLM_ID
    assert len(call["id"]) <= 40
    assert sent[-1]["role"] == "tool"
    assert sent[-1]["tool_call_id"] == call["id"]


async def test_a_reply_of_large_writes_is_recorded_within_one_bus_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four writes of quotes: every call under the million characters a call's arguments
    keep, their JSON (each quote escaped twice) over what a bus message holds — the bound
    scaled down tenfold here (450,000 quotes a write against 8 MB). The entry was refused
    (the activation failed, its retry likely again); the largest now stand in, the files are
    written whole."""
    monkeypatch.setattr("suzumio.runner.agent.MAX_ENTRY_BYTES", MAX_ENTRY_BYTES // 10)
    content = '"' * 45_000
    writes = [
        ModelToolCall("file_write", {"path": f"f{i}.txt", "content": content}) for i in range(4)
    ]
    broker = Broker()
    replies = [Reply.tool_calls(writes), Reply.text("ok")]
    run = await run_loop(tmp_path, spec(tmp_path), replies, broker)
    assert run.ending.reason == "completed"
    assert all((tmp_path / f"f{i}.txt").read_text() == content for i in range(4))
    appended = [e for b in broker.bodies["/runner/history"] for e in b["entries"]]
    calls = next(e["tool_calls"] for e in appended if e.get("tool_calls"))
    assert sum(len(json.dumps(c["arguments"])) for c in calls) <= MAX_ENTRY_BYTES // 10
    kept = ["truncated_arguments" not in c["arguments"] for c in calls]
    assert True in kept
    assert False in kept
