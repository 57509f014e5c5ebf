"""What `suzumio chat` prints from a session's timeline: the live text of the activations
handed the message (and nothing of others), a line per tool call, the recorded output when
no live text came, and the signal's closing."""

from __future__ import annotations

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


async def test_the_recorded_output_stands_in_for_missing_live_text(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(chat, "SETTLE_SECONDS", 0.05)
    talk = Conversation("session", "s1")
    talk.take("session.signals_delivered", delivered(["s1"], "a1"))
    await chat._settle(talk, "a1", {"output_text": "The answer."})  # no entry came: waits
    assert capsys.readouterr().out == "The answer.\n"


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
