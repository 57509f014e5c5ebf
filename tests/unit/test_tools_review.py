"""The runner's sandbox tools and the loop around them, after a review: HTML that never closes
its constructs converts in linear time (and never raises), a lone surrogate in a model's
arguments is that call's error instead of the activation's crash, a NUL in a command is
refused on every event loop, and a policy naming a tool by its wire name holds. The model is
the scripted model server (the one allowed fake); the broker an `httpx.MockTransport`
recording what the runner sends."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
import uvloop

from suzumio.contracts.values import ModelSpec, ToolPolicy
from suzumio.runner.agent import AgentLoop, Ending
from suzumio.runner.broker import BrokerClient
from suzumio.runner.live import LiveStream
from suzumio.runner.model import Endpoint, ModelClient
from suzumio.runner.toolbox import Toolbox
from suzumio.runner.tools.base import ToolContext
from suzumio.runner.tools.shell import ShellExec
from suzumio.runner.tools.web import WebFetch, html_to_text
from suzumio.testing.model_server import Reply, ScriptedModelServer, ToolCall
from tests.unit.loop_support import TOKEN, Broker, spec

# --- web.fetch's HTML to text --------------------------------------------------------------


@pytest.mark.parametrize(
    ("piece", "text"),
    [("<a ", ""), ("<!--x>", ""), ("<?x", ""), ("<![CDATA[x>", ""), ("</", ""),
     ("<a b='x>", ""), ("< ", "< " * 999 + "<"), ("<script>", "")],
    ids=["tag", "comment", "pi", "cdata", "endtag", "quote", "lt", "script"],
)  # fmt: skip
def test_html_that_never_closes_runs_to_the_end_of_the_page(piece: str, text: str) -> None:
    """A construct that does not end takes the rest of the page, as in a browser: what came
    before it is kept. (How long a page of thousands of them takes is `make bench`'s
    `runner_tools` figure: `html.parser` rescanned the rest of the page at each one, 60 KB of
    `<a ` took 49 s on the event loop.)"""
    assert html_to_text("<p>kept</p>" + piece * 1_000).split("\n")[0] == "kept"
    assert html_to_text(piece * 1_000) == text


def test_malformed_declarations_do_not_raise() -> None:
    """Before, `<![x>` made `html.parser` raise AssertionError: the page could not be read."""
    assert html_to_text("<p>before</p><![x><p>after</p>") == "before\n\nafter"
    assert html_to_text("<![<![<![ text") == ""


def test_html_to_text_keeps_what_the_parser_kept() -> None:
    page = (
        "<!DOCTYPE html><html><head><TITLE>T</TITLE><SCRIPT type='x'>var a = '</p>';</SCRIPT>"
        "</head><body><p title='a > b'>x &lt; y &amp;&amp; z</p><br/>"
        "<svg><text>hidden</text></svg><iframe src=x></iframe>"
        "<a title=\"x>y\" href='/q?a=1&amp;b=2'>q</a> <a href=/plain>p</a> <a href>e</a> "
        "<a href='#top'>top</a> 1 < 2 <!-- a comment --> <style>p{}</style>end</body></html>"
    )
    assert html_to_text(page) == ("T\n\nx < y && z\n\nq (/q?a=1&b=2) p (/plain) e top 1 < 2 end")


# --- malformed arguments -------------------------------------------------------------------


async def run_loop(
    tmp_path: Path, replies: list[Reply], permissions: dict[str, ToolPolicy] | None = None
) -> tuple[Ending, Broker]:
    broker = Broker()
    http = httpx.AsyncClient(base_url="http://broker", transport=httpx.MockTransport(broker.answer))
    client = BrokerClient("http://broker", TOKEN, http=http)
    activation = spec(tmp_path)
    if permissions is not None:
        activation = activation.model_copy(update={"permissions": permissions})
    ctx = ToolContext(workspace=tmp_path, env={"PATH": "/usr/bin:/bin"})
    toolbox = Toolbox(activation, client, ctx)
    async with ScriptedModelServer() as server:
        server.script(replies)
        model = ModelClient(ModelSpec(name="primary"), Endpoint(f"{server.url}/v1", "k"))
        loop = AgentLoop(activation, client, [model], toolbox, LiveStream(client), [])
        try:
            ending = await loop.run()
        finally:
            await model.close()
            await http.aclose()
    return ending, broker


async def test_a_lone_surrogate_in_a_path_is_the_calls_error(tmp_path: Path) -> None:
    """A JSON `\\ud800` escape decodes to a lone surrogate. Before, planning the round (the
    write's reserved path) raised UnicodeEncodeError and the activation crashed."""
    calls = [
        ToolCall("file_write", '{"path": "a\\ud800.txt", "content": "x"}'),
        ToolCall("file_read", '{"path": "b\\ud800"}'),
        ToolCall("shell_exec", '{"command": "true", "cwd": "c\\ud800"}'),
    ]
    ending, broker = await run_loop(tmp_path, [Reply.tool_calls(calls), Reply.text("done")])
    assert (ending.reason, ending.text) == ("completed", "done")
    results = broker.tool_results()
    assert len(results) == 3
    assert all("lone surrogate" in r["text"] for r in results), results
    assert not any(p.name.startswith("a") for p in tmp_path.iterdir())


async def test_a_lone_surrogate_in_a_url_is_an_error_result() -> None:
    url = "http://127.0.0.1/\ud800"
    result = await WebFetch().run({"url": url}, ToolContext(workspace=Path("/nonexistent")))
    assert result.status == "error"
    assert "not a valid URL" in result.text


async def _nul_command(tmp_path: Path) -> Any:
    ctx = ToolContext(workspace=tmp_path, env={"PATH": "/usr/bin:/bin"})
    return await ShellExec().run({"command": "touch first\x00; touch second"}, ctx)


def test_a_nul_in_a_command_is_refused_on_uvloop(tmp_path: Path) -> None:
    """uvloop, the runner's event loop where installed, ran the part before the NUL (`touch
    first`): not the command the model sent, the audit recorded or a person approved."""
    result = uvloop.run(_nul_command(tmp_path))
    assert result.status == "error"
    assert "NUL" in result.text
    assert not (tmp_path / "first").exists()


# --- permissions ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "permissions",
    [
        {"shell_exec": ToolPolicy.DENY},
        {"shell.exec": ToolPolicy.ALLOW, "shell_exec": ToolPolicy.DENY},
        {"shell.exec": ToolPolicy.DENY, "shell_exec": ToolPolicy.ALLOW},
    ],
    ids=["wire-name", "wire-name-stricter", "canonical-stricter"],
)
async def test_a_policy_naming_the_wire_name_holds(
    tmp_path: Path, permissions: dict[str, ToolPolicy]
) -> None:
    """The model sees `shell_exec`; a `deny` written under that name used to be ignored, and
    the command ran."""
    calls = [ToolCall("shell_exec", {"command": "touch pwned"})]
    ending, broker = await run_loop(
        tmp_path, [Reply.tool_calls(calls), Reply.text("done")], permissions
    )
    assert ending.reason == "completed"
    (result,) = broker.tool_results()
    assert "denied by this agent's policy" in result["text"]
    assert not (tmp_path / "pwned").exists()
    (finished,) = broker.bodies["/runner/tool-calls/finish"]
    assert finished["status"] == "denied"
