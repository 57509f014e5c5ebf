"""A toolpack's tool whose name the model could not tell from another's is not offered: not
one named as a core or built-in tool (it would replace that definition while another handler
ran), nor one equal to an earlier tool on the wire (`notes.add` and `notes_add`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest_asyncio

from suzumio.contracts.runner import ToolDefinition
from suzumio.contracts.toolpacks import ToolpackManifest
from suzumio.runner.broker import BrokerClient
from suzumio.runner.toolbox import Toolbox
from suzumio.runner.tools.base import ToolContext
from tests.unit.test_example_toolpack import spec_for

HANDLER = "os.path:basename"  # any callable: nothing runs here


def tool(name: str, description: str = "from the pack") -> ToolDefinition:
    return ToolDefinition(name=name, description=description, parameters={"type": "object"})


PACK = ToolpackManifest(
    name="notes",
    tools=(
        tool("message.send"),  # core's
        tool("file_read"),  # a built-in's, on the wire
        tool("web.fetch"),  # a built-in's, though its pack is not enabled here
        tool("notes.add", "the first"),
        tool("notes_add", "the second"),  # the first's, on the wire
    ),
    runner_handlers=dict.fromkeys(
        ("message.send", "file_read", "web.fetch", "notes.add", "notes_add"), HANDLER
    ),
)


@pytest_asyncio.fixture
async def broker() -> AsyncIterator[BrokerClient]:
    client = BrokerClient("http://127.0.0.1:9", "unused")
    yield client
    await client.aclose()


async def test_a_pack_tool_named_like_another_is_not_offered(
    tmp_path: Path, broker: BrokerClient
) -> None:
    spec = spec_for(tmp_path, "notes", "files")
    box = Toolbox(spec, broker, ToolContext(workspace=tmp_path), manifests={"notes": PACK})
    by_name = {d["function"]["name"]: d["function"] for d in box.wire_definitions()}
    assert by_name["message_send"]["description"] != "from the pack"
    assert by_name["file_read"]["description"] != "from the pack"
    assert "web_fetch" not in by_name
    assert by_name["notes_add"]["description"] == "the first"
    assert box.canonical("notes_add") == "notes.add"
    assert box.canonical("message_send") == "message.send"
    assert len(box.wire_definitions()) == len(by_name)  # no name offered twice
