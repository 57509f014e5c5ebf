"""What `suzumio chat` prints from a session's timeline: the live text of the activations
handed the message (and nothing of others), a line per tool call, the recorded output when
no live text came, and the signal's closing."""

from __future__ import annotations

import asyncio
import os

import pytest

from suzumio.cli import chat
from suzumio.cli.chat import Conversation


def delivered(signal_ids: list[str], activation_id: str) -> dict[str, object]:
    return {"data": {"activation_id": activation_id, "signal_ids": signal_ids}}


def live(activation_id: str, kind: str, text: str, **data: object) -> dict[str, object]:
    return {"activation_id": activation_id, "kind": kind, "text": text, "data": data}


def entry(activation_id: str, text: str, tool_calls: bool = False) -> dict[str, object]:
    calls = [{"id": "c1", "name": "shell_exec", "arguments": "{}"}] if tool_calls else []
    body = {"role": "assistant", "activation_id": activation_id, "text": text}
    return {"data": {**body, "tool_calls": calls}}


async def test_only_the_messages_activations_are_printed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    talk = Conversation("session", "s1")
    talk.take("live", live("other", "text", "not ours"))  # before any delivery: not ours
    talk.take("session.signals_delivered", delivered(["s0"], "other"))
    talk.take("session.signals_delivered", delivered(["s0", "s1"], "a1"))
    talk.take("live", live("other", "text", "still not ours"))
    talk.take("live", live("a1", "text", "Hel"))
    talk.take("live", live("a1", "tool_progress", "shell.exec", phase="started"))
    talk.take("live", live("a1", "tool_progress", "shell.exec", phase="finished"))
    talk.take("session.message_appended", entry("a1", "", tool_calls=True))
    talk.take("live", live("a1", "text", "lo."))
    talk.take("session.message_appended", entry("a1", "Hello."))  # after its live text: once
    await chat._settle(talk, "a1", {"output_text": "Hello."})

    assert capsys.readouterr().out == "Hel\n· shell.exec\nlo.\n"
    assert talk.activations == {"a1": "handed"}
    assert talk.finished == {"a1"}


def test_a_retry_discards_the_text_shown_and_the_signal_closing_is_kept(
    capsys: pytest.CaptureFixture[str],
) -> None:
    talk = Conversation("session", "s1")
    talk.take("session.signals_delivered", delivered(["s1"], "a1"))
    talk.take("live", live("a1", "text", "half"))
    talk.take("live", live("a1", "state", "retrying: the text above is discarded", discard=True))
    talk.take("session.signal_closed", {"data": {"signal_id": "s0", "outcome": "failed"}})
    assert talk.closed is None
    talk.take(
        "session.signal_closed",
        {"data": {"signal_id": "s1", "outcome": "failed", "reason": "budget spent"}},
    )
    assert capsys.readouterr().out == "half\n[retrying: the text above is discarded]\n"
    assert talk.closed == ("failed", "budget spent")


def recorded(signal_id: str, pending_action_id: str) -> dict[str, object]:
    payload = {"pending_action_id": pending_action_id, "outcome": "answered"}
    return {"data": {"signal_id": signal_id, "payload": payload}}


def test_live_text_that_comes_before_the_handover_is_printed_once_it_comes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The timeline sends the live stream's backlog before the log's events: an activation's
    first words came before the event handing it the message, and were dropped."""
    talk = Conversation("session", "s1")
    talk.take("live", live("a1", "text", "The first words"))
    talk.take("live", live("other", "text", "not ours"))
    assert capsys.readouterr().out == ""
    talk.take("session.activation_requested", delivered(["s1"], "a1"))  # started for it
    talk.take("session.signals_delivered", delivered(["s1"], "a1"))
    talk.take("live", live("a1", "text", ", then the rest."))
    talk.take("session.signals_delivered", delivered(["s1"], "a1"))  # again: nothing twice
    assert capsys.readouterr().out == "The first words, then the rest."
    assert "a1" not in talk.early


def test_what_a_running_activation_said_before_it_took_the_message_is_not_printed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The message was handed to an activation already at work on an earlier one: the words
    it wrote before it took this one are about that work, and printed they read as the start
    of this message's answer."""
    talk = Conversation("session", "s1")
    talk.take("live", live("a0", "text", "About the earlier question: "))
    talk.take("session.signals_delivered", delivered(["s1"], "a0"))  # mid-run: no request
    talk.take("live", live("a0", "text", "and about yours."))
    assert capsys.readouterr().out == "and about yours."
    assert talk.activations == {"a0": "handed"}


def test_the_chunks_kept_before_a_handover_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(chat, "EARLY_ACTIVATIONS", 2)
    monkeypatch.setattr(chat, "EARLY_CHUNKS", 3)
    talk = Conversation("session", "s1")
    for activation_id in ("a1", "a2", "a3"):
        for n in range(5):
            talk.take("live", live(activation_id, "text", str(n)))
    assert list(talk.early) == ["a2", "a3"]  # the oldest activation's went
    assert all(len(chunks) == 3 for chunks in talk.early.values())


async def test_an_answer_given_here_after_the_wait_ended_is_followed(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Typed after the activation stopped waiting: the answer is accepted and its own signal
    starts the next activation. The chat said "the agent waits" and exited 3."""
    monkeypatch.setattr(chat, "SETTLE_SECONDS", 0.01)
    talk = Conversation("session", "s1")
    talk.take("session.signals_delivered", delivered(["s1"], "a1"))
    talk.answered["p1"] = "a1"
    talk.take("session.signal_recorded", recorded("r1", "p1"))
    talk.take("session.signal_recorded", recorded("r0", "someone else's"))
    assert talk.signals == {"s1", "r1"}
    waiting = {"status": "completed", "end_reason": "waiting", "output_text": "waiting for x"}
    assert await chat._ended(talk, "a1", waiting) is None  # goes on
    talk.take("session.signals_delivered", delivered(["r1"], "a2"))
    talk.take("live", live("a2", "text", "Thanks for the answer."))
    assert talk.activations == {"a1": "handed", "a2": "handed"}
    assert "Thanks for the answer." in capsys.readouterr().out


async def test_an_answer_the_activation_took_while_it_ran_does_not_hold_the_chat(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its answer reached it at a tool call; it then ended waiting on something else, nobody
    answered that: exit 3, not a wait for a next activation that no answer starts."""
    monkeypatch.setattr(chat, "SETTLE_SECONDS", 0.01)
    talk = Conversation("session", "s1")
    talk.take("session.signals_delivered", delivered(["s1"], "a1"))
    talk.answered["p1"] = "a1"
    talk.take("session.signal_recorded", recorded("r1", "p1"))
    talk.take("session.signals_delivered", delivered(["r1"], "a1"))
    waiting = {"status": "completed", "end_reason": "waiting", "output_text": "waiting for y"}
    assert await chat._ended(talk, "a1", waiting) == chat.WAITING


async def still_open() -> bool:
    return True


async def test_a_prompt_gives_up_when_the_messages_work_is_closed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(chat, "PROMPT_LOOK_SECONDS", 0.02)
    talk = Conversation("session", "s1")
    read, write = os.pipe()
    loop = asyncio.get_running_loop()
    lines = chat.StdinLines(read)
    loop.add_reader(read, lines.readable)
    try:
        loop.call_later(0.1, setattr, talk, "closed", ("cancelled", "asked"))
        assert await asyncio.wait_for(chat._typed(lines, talk, still_open), 10) == b""
    finally:
        loop.remove_reader(read)
        os.close(read)
        os.close(write)


@pytest.mark.parametrize(
    ("texts", "tool_entry", "output", "printed"),
    [
        pytest.param([], False, "The answer.", "The answer.\n", id="no-live-text"),
        pytest.param(
            ["The answer, ", "in full."],
            False,
            "The answer, in full.",
            "The answer, in full.\n",
            id="shown-live-entry-lagging",
        ),
        pytest.param(
            ["Let me check."],
            True,
            "The result.",
            "Let me check.\nThe result.\n",
            id="activation-complete",
        ),
    ],
)
async def test_the_recorded_output_is_printed_unless_the_live_text_said_it(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    texts: list[str],
    tool_entry: bool,
    output: str,
    printed: str,
) -> None:
    """No final entry came (within the settle wait): the output stands in for live text that
    never came; live text that ends with it is not printed again (the entry lags); and the
    result of `activation.complete`, in the output only, is printed after what was said."""
    monkeypatch.setattr(chat, "SETTLE_SECONDS", 0.05)
    talk = Conversation("session", "s1")
    talk.take("session.signals_delivered", delivered(["s1"], "a1"))
    for text in texts:
        talk.take("live", live("a1", "text", text))
    if tool_entry:
        talk.take("session.message_appended", entry("a1", texts[-1], tool_calls=True))
    await chat._settle(talk, "a1", {"output_text": output})
    assert capsys.readouterr().out == printed


async def test_an_activation_out_of_model_calls_is_no_success(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Completed with reason `budget_exhausted` (the runner's exit 4): its answer is a summary
    of where it stopped, and the chat says so and exits 4, which a script can tell from 0."""
    monkeypatch.setattr(chat, "SETTLE_SECONDS", 0.01)
    talk = Conversation("session", "s1")
    talk.take("session.signals_delivered", delivered(["s1"], "a1"))
    talk.take("live", live("a1", "text", "Here is where I stopped."))
    spent = {"status": "completed", "end_reason": "budget_exhausted", "output_text": "summary"}
    assert await chat._ended(talk, "a1", spent) == chat.BUDGET_EXHAUSTED == 4
    assert "ran out of model calls" in capsys.readouterr().out
    done = {"status": "completed", "end_reason": "completed", "output_text": "all done"}
    assert await chat._ended(talk, "a1", done) == 0
