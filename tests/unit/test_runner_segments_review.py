"""A read of a path a write of the same reply touches runs after it (DESIGN.md Appendix A: "a
call overlapping a reserved path starts a new segment"). Before, `file.read` and `file.search`
named no path, so `[file.write a.txt, file.read a.txt]` ran in one segment and the read
returned the old or the new content by chance. The model is the scripted model server (the one
allowed fake); the broker an `httpx.MockTransport` recording what the runner sends, in order."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from suzumio.contracts.runner import RunnerToolpackSpec
from suzumio.contracts.values import ModelSpec
from suzumio.runner.agent import AgentLoop
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

    http = httpx.AsyncClient(base_url="http://broker", transport=httpx.MockTransport(answer))
    client = BrokerClient("http://broker", TOKEN, http=http)
    activation = spec(tmp_path)
    (tmp_path / "a.txt").write_text("old")
    toolbox = Toolbox(activation, client, ToolContext(workspace=tmp_path))
    content = "new\n" * 200_000  # a write that takes a while: the read must still wait
    async with ScriptedModelServer() as server:
        server.script(
            [
                Reply.tool_calls(
                    [
                        ToolCall("file_write", {"path": "a.txt", "content": content}, id="w"),
                        ToolCall("file_read", {"path": "a.txt", "limit": 1}, id="r"),
                    ]
                ),
                Reply.text("done"),
            ]
        )
        model = ModelClient(ModelSpec(name="primary"), Endpoint(f"{server.url}/v1", "k"))
        loop = AgentLoop(activation, client, [model], toolbox, LiveStream(client), [])
        try:
            ending = await loop.run()
        finally:
            await model.close()
            await http.aclose()
    assert ending.reason == "completed"
    assert order == [("start", "w"), ("finish", "w"), ("start", "r"), ("finish", "r")]
    results = {r["tool_call_id"]: r["text"] for r in broker.tool_results()}
    assert "new" in results["r"]
    assert "old" not in results["r"]
