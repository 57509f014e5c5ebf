"""A scripted OpenAI-compatible model server for tests, and the offline demo model.

The only fake in Suzumio's tests (DESIGN.md §13): tests drive it through the real `openai` SDK.
Each chat-completion request plays the next scripted step: text or tool calls (streamed or
not), an HTTP error with the provider's body and headers, or a responder computed from the
request. `DemoModel` is the offline demo model `suzumio up` uses without a model key (§12).

In a test:

    async with ScriptedModelServer() as server:
        server.script([Reply.tool_calls([ToolCall("file_read", {"path": "a.txt"})]),
                       Reply.text("done", usage=Usage(prompt_tokens=10, completion_tokens=3))])
        server.script([Reply.model_not_found("primary")], model="primary")
        client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="test", max_retries=0)
        ...
        await server.wait_for_requests(2)

As a process (prints its URL, `http://127.0.0.1:PORT`, on one line, then serves until SIGTERM):

    python -m suzumio.testing.model_server --port 0 [--demo] [--script steps.json]

`--demo` makes the demo model answer whatever the script does not; the JSON script format is
described in `suzumio.testing.model.script_file`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from pathlib import Path

from suzumio.testing.model.demo import DEMO_MODEL_NAME, LABEL, DemoModel
from suzumio.testing.model.noop import NoopModelServer
from suzumio.testing.model.replies import Reply, ToolCall, Usage, error_body
from suzumio.testing.model.script import Responder, Step, script_exhausted
from suzumio.testing.model.script_file import ScriptSpec, load_script
from suzumio.testing.model.server import RecordedRequest, ScriptedModelServer

__all__ = [
    "DEMO_MODEL_NAME",
    "LABEL",
    "DemoModel",
    "NoopModelServer",
    "RecordedRequest",
    "Reply",
    "Responder",
    "ScriptSpec",
    "ScriptedModelServer",
    "Step",
    "ToolCall",
    "Usage",
    "error_body",
    "load_script",
    "main",
    "script_exhausted",
]


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m suzumio.testing.model_server",
        description="Scripted OpenAI-compatible model server (tests) / offline demo model.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--demo", action="store_true", help="the demo model answers by default")
    parser.add_argument("--script", type=Path, help="a JSON script (see model.script_file)")
    return parser.parse_args(argv)


async def serve(args: argparse.Namespace) -> None:
    default: Step = DemoModel() if args.demo else script_exhausted
    server = ScriptedModelServer(host=args.host, port=args.port, default=default)
    if args.script is not None:
        server.load_script(args.script)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        sys.stdout.write(server.url + "\n")
        sys.stdout.flush()
        await stop.wait()


def main(argv: list[str] | None = None) -> None:
    args = _arguments(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args))


if __name__ == "__main__":
    main()
