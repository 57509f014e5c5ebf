"""A read of a path a write of the same reply touches runs after it (DESIGN.md Appendix A: "a
call overlapping a reserved path starts a new segment"). Before, `file.read` and `file.search`
named no path, so `[file.write a.txt, file.read a.txt]` ran in one segment and the read
returned the old or the new content by chance. The model is the scripted model server (the one
allowed fake); the broker an `httpx.MockTransport` recording what the runner sends, in order."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from suzumio.contracts.runner import RunnerActivationInput, RunnerConfig, RunnerToolpackSpec
from suzumio.contracts.values import ModelSpec
from suzumio.runner.agent import AgentLoop, Ending
from suzumio.runner.broker import BrokerClient
from suzumio.runner.live import LiveStream
from suzumio.runner.loop.segments import PlannedCall, segment
from suzumio.runner.model import Endpoint, ModelClient
from suzumio.runner.toolbox import Toolbox
from suzumio.runner.tools.base import ToolContext
from suzumio.testing.model import wire
from suzumio.testing.model_server import Reply, ScriptedModelServer, ToolCall
from tests.unit.loop_support import TOKEN, Broker, spec


def plan(toolbox: Toolbox, calls: list[tuple[str, dict[str, Any]]]) -> list[list[int]]:
    """The segments the loop would run these calls in (as `AgentLoop._tool_round` plans)."""
    planned = [
        PlannedCall(i, toolbox.kind(tool, args), toolbox.paths(tool, args))
        for i, (tool, args) in enumerate(calls)
    ]
    return segment(planned)


def toolbox_for(workspace: Path) -> Toolbox:
    client = BrokerClient("http://broker", TOKEN, http=httpx.AsyncClient())
    packs = (RunnerToolpackSpec(name="files"), RunnerToolpackSpec(name="web"))
    return Toolbox(spec(workspace, toolpacks=packs), client, ToolContext(workspace=workspace))


WRITE_A = ("file.write", {"path": "a.txt", "content": "new"})


@pytest.mark.parametrize(
    ("calls", "expected"),
    [
        pytest.param([WRITE_A, ("file.read", {"path": "a.txt"})], [[0], [1]], id="write-read"),
        pytest.param([("file.read", {"path": "a.txt"}), WRITE_A], [[0], [1]], id="read-write"),
        pytest.param(
            [WRITE_A, ("file.read", {"path": "./sub/../a.txt"})], [[0], [1]], id="same-file"
        ),
        pytest.param([WRITE_A, ("file.read", {"path": "."})], [[0], [1]], id="read-the-dir"),
        pytest.param(
            [WRITE_A, ("file.search", {"pattern": "new"})], [[0], [1]], id="search-workspace"
        ),
        pytest.param(
            [
                ("file.write", {"path": "d/x.txt", "content": "x"}),
                ("file.search", {"pattern": "x", "path": "d"}),
            ],
            [[0], [1]],
            id="search-root-holds-the-write",
        ),
        pytest.param(
            [
                WRITE_A,
                ("file.read", {"path": "b.txt"}),
                ("file.search", {"pattern": "x", "path": "d"}),
            ],
            [[0, 1, 2]],
            id="disjoint-paths-share",
        ),
        pytest.param(
            [
                ("file.read", {"path": "a.txt"}),
                ("file.read", {"path": "a.txt"}),
                ("file.search", {"pattern": "x"}),
            ],
            [[0, 1, 2]],
            id="reads-share",
        ),
        pytest.param(
            [WRITE_A, ("web.fetch", {"url": "https://example.com/"})], [[0, 1]], id="web-fetch"
        ),
    ],
)
def test_a_read_overlapping_a_write_of_the_same_reply_gets_its_own_segment(
    tmp_path: Path, calls: list[tuple[str, dict[str, Any]]], expected: list[list[int]]
) -> None:
    (tmp_path / "a.txt").write_text("old")
    (tmp_path / "sub").mkdir()
    (tmp_path / "d").mkdir()
    assert plan(toolbox_for(tmp_path), calls) == expected


def test_a_read_through_a_link_overlaps_the_linked_file(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("old")
    (tmp_path / "alias.txt").symlink_to(tmp_path / "a.txt")
    calls = [WRITE_A, ("file.read", {"path": "alias.txt"})]
    assert plan(toolbox_for(tmp_path), calls) == [[0], [1]]


async def run_against(
    activation: RunnerActivationInput,
    answer: Callable[[httpx.Request], Any],
    workspace: Path,
    calls: list[ToolCall],
) -> Ending:
    """The loop of `activation`: the scripted model asks for `calls`, then answers "done";
    the broker is `answer`."""
    http = httpx.AsyncClient(base_url="http://broker", transport=httpx.MockTransport(answer))
    client = BrokerClient("http://broker", TOKEN, http=http)
    toolbox = Toolbox(activation, client, ToolContext(workspace=workspace))
    async with ScriptedModelServer() as server:
        server.script([Reply.tool_calls(calls), Reply.text("done")])
        model = ModelClient(ModelSpec(name="primary"), Endpoint(f"{server.url}/v1", "k"))
        loop = AgentLoop(activation, client, [model], toolbox, LiveStream(client), [])
        try:
            return await loop.run()
        finally:
            await model.close()
            await http.aclose()


async def test_the_read_after_a_write_sees_the_new_content(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """End to end through the loop: the read starts only after the write finished, and shows
    what the write wrote."""
    # The large write streamed in big fragments: in the provider's 8-character ones it is
    # 125,000 chunks, seconds of streaming that test nothing of the segments.
    monkeypatch.setattr(wire, "ARGUMENT_FRAGMENT_CHARS", 64 * 1024)
    order: list[tuple[str, str]] = []
    broker = Broker()

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path.startswith("/runner/tool-calls/"):
            body = json.loads(request.content)
            order.append((request.url.path.rsplit("/", 1)[-1], body["call_id"]))
        return broker.answer(request)

    (tmp_path / "a.txt").write_text("old")
    content = "new\n" * 200_000  # a write that takes a while: the read must still wait
    calls = [
        ToolCall("file_write", {"path": "a.txt", "content": content}, id="w"),
        ToolCall("file_read", {"path": "a.txt", "limit": 1}, id="r"),
    ]
    ending = await run_against(spec(tmp_path), answer, tmp_path, calls)
    assert ending.reason == "completed"
    assert order == [("start", "w"), ("finish", "w"), ("start", "r"), ("finish", "r")]
    results = {r["tool_call_id"]: r["text"] for r in broker.tool_results()}
    assert "new" in results["r"]
    assert "old" not in results["r"]


async def test_a_call_that_ran_keeps_its_outcome_and_its_audit_end_when_the_round_ends_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The write ran; its audit's end was still on its way (a slow broker) when the round's
    time limit came. Before, the end went with the cut wait — never recorded, the call shown
    running for ever — and the model heard the call timed out, though it had done its work
    (for a message sent, an invitation to send it again). Now the end is recorded as it was,
    and the model hears what the call did."""
    broker = Broker()
    finishes: list[dict[str, Any]] = []

    async def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/tool-calls/finish"):
            await asyncio.sleep(1.0)  # longer than the round may take
            finishes.append(json.loads(request.content))
        return broker.answer(request)

    monkeypatch.setattr(AgentLoop, "_allowed_seconds", lambda self, call: 0.0)
    activation = spec(tmp_path).model_copy(
        update={"runner": RunnerConfig(tool_timeout_seconds=0.2)}
    )
    calls = [ToolCall("file_write", {"path": "a.txt", "content": "x"}, id="w")]
    ending = await run_against(activation, answer, tmp_path, calls)
    assert ending.reason == "completed"
    assert (tmp_path / "a.txt").read_text() == "x"
    assert [(f["call_id"], f["status"]) for f in finishes] == [("w", "ok")]
    [result] = broker.tool_results()
    assert "time limit" not in result["text"]
