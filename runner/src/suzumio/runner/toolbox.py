"""The tools an activation offers the model, and how each one runs.

Offered: the `core` tools always (messages, signals, ask_user, checkpoint, completion); the
built-in toolpacks `files`, `shell`, `web` when the agent names them (as toolpacks, or their
tools by name); and the tools of any other toolpack of the activation whose manifest is
installed in the sandbox (entry points `suzumio.toolpacks`). An agent that names nothing gets
`files` and `shell`.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar, cast

from suzumio.contracts.policies import wire_name
from suzumio.contracts.runner import RunnerActivationInput, ToolDefinition
from suzumio.contracts.toolpacks import ToolpackManifest, discover, resolve
from suzumio.runner.broker import BrokerClient
from suzumio.runner.log import log
from suzumio.runner.tools.base import (
    CallKind,
    SandboxTool,
    TimedTool,
    ToolContext,
    ToolInputError,
    ToolResult,
)
from suzumio.runner.tools.core import CORE_TOOLS, EXCLUSIVE, CoreOutcome, CoreTools
from suzumio.runner.tools.registry import builtin_tools

BUILTIN_PACKS: dict[str, tuple[str, ...]] = {
    "files": ("file.read", "file.write", "file.patch", "file.search"),
    "shell": ("shell.exec",),
    "web": ("web.fetch",),
}
DEFAULT_PACKS = ("files", "shell")
_BUILTIN_TOOLS = frozenset(t for tools in BUILTIN_PACKS.values() for t in tools)
T = TypeVar("T")
Handler = Callable[[dict[str, Any], ToolContext], Awaitable[ToolResult | str] | ToolResult | str]


class Toolbox:
    def __init__(
        self,
        spec: RunnerActivationInput,
        broker: BrokerClient,
        ctx: ToolContext,
        manifests: dict[str, ToolpackManifest] | None = None,
    ) -> None:
        self.ctx = ctx
        self.core = CoreTools(
            broker, spec.activation.id, spec.session.id, spec.runner.ask_wait_seconds
        )
        sandbox = builtin_tools()
        self._sandbox: dict[str, SandboxTool] = {}
        self._handlers: dict[str, Handler] = {}
        self._definitions: dict[str, ToolDefinition] = dict(CORE_TOOLS)
        named = {t.name for t in spec.tools}
        packs = {t.name for t in spec.toolpacks}
        if not (named - set(CORE_TOOLS)) and not (packs - {"core"}):
            packs |= set(DEFAULT_PACKS)
        for pack, tools in BUILTIN_PACKS.items():
            for tool in tools:
                if pack in packs or tool in named:
                    self._sandbox[tool] = sandbox[tool]
                    self._definitions[tool] = sandbox[tool].definition
        extra = packs - set(BUILTIN_PACKS) - {"core"}
        if extra:
            found = discover() if manifests is None else manifests
            for pack in sorted(extra):
                manifest = found.get(pack)
                if manifest is None:
                    log("toolpack.missing", toolpack=pack)
                    continue
                self._add_pack(manifest)
        self._by_wire = {wire_name(name): name for name in self._definitions}

    def _add_pack(self, manifest: ToolpackManifest) -> None:
        # Names the model could not tell apart: a built-in's or core's (whose definition it
        # would replace while another handler runs) or another tool's on the wire (`todo.add`
        # and `todo_add` both go out as `todo_add`).
        taken = {wire_name(n) for n in (*self._definitions, *_BUILTIN_TOOLS)}
        for definition in manifest.tools:
            ref = manifest.runner_handlers.get(definition.name)
            if ref is None:
                continue
            if wire_name(definition.name) in taken:
                log("toolpack.tool_name_taken", toolpack=manifest.name, tool=definition.name)
                continue
            try:
                self._handlers[definition.name] = resolve(ref)
            except Exception as exc:
                log("toolpack.handler_unloadable", toolpack=manifest.name, error=repr(exc))
                continue
            self._definitions[definition.name] = definition
            taken.add(wire_name(definition.name))

    # -- what the model sees ---------------------------------------------------------------
    def wire_definitions(self) -> list[dict[str, Any]]:
        return [
            {
                "type": "function",
                "function": {
                    "name": wire_name(d.name),
                    "description": d.description,
                    "parameters": d.parameters,
                },
            }
            for d in self._definitions.values()
        ]

    def canonical(self, wire: str) -> str | None:
        return self._by_wire.get(wire) or (wire if wire in self._definitions else None)

    def read_only(self, tool: str) -> bool:
        """Whether `tool`'s definition says it changes nothing (what the nudge rule counts as
        no effect)."""
        definition = self._definitions.get(tool)
        return definition is not None and definition.read_only

    # -- how calls share a round -------------------------------------------------------------
    def kind(self, tool: str, args: dict[str, Any]) -> CallKind:
        if tool in self._sandbox:
            return self._sandbox[tool].kind(args)
        if tool in EXCLUSIVE or tool in self._handlers:
            return "exclusive"
        return "read" if self._definitions[tool].read_only else "exclusive"

    def paths(self, tool: str, args: dict[str, Any]) -> tuple[Path, ...]:
        if tool in self._sandbox:
            try:
                return self._sandbox[tool].paths(args, self.ctx)
            except (ToolInputError, OSError, ValueError):
                # The call will fail on its own, as its result; planning must not raise (the
                # round would end the activation), and a write reserving nothing runs alone.
                return ()
        return ()

    def allowed_seconds(self, tool: str, args: dict[str, Any]) -> float:
        """How long a call may take by a time limit of its own (0: none, the tool round's limit
        alone bounds it): a command's timeout, a search's or a fetch's, ask_user's wait."""
        sandbox: object = self._sandbox.get(tool)  # some have a limit of their own
        if isinstance(sandbox, TimedTool):
            return sandbox.allowed_seconds(args, self.ctx)
        if tool == "ask_user":
            return self.core.ask_wait
        return 0.0

    # -- running -----------------------------------------------------------------------------
    async def run(
        self, tool: str, args: dict[str, Any], call_id: str, approved: str | None = None
    ) -> CoreOutcome:
        """Run a call. `approved`: its arguments as the model wrote them, when a person
        approved it (policy `ask`): what the broker finds the approval by."""
        if tool in self._sandbox:
            return CoreOutcome(await self._sandbox[tool].run(args, self.ctx))
        if tool in self._handlers:
            handler = self._handlers[tool]
            try:
                if inspect.iscoroutinefunction(handler):
                    result = await handler(args, self.ctx)
                else:
                    # A plain function runs off the event loop: one that blocks (a slow
                    # request, a long computation) stalled the live output, the heartbeats
                    # and every time limit, the tool round's own included.
                    result = await _in_daemon_thread(handler, args, self.ctx)
                if inspect.isawaitable(result):
                    result = await result
            except ToolInputError as exc:
                return CoreOutcome(ToolResult(str(exc), "error"))
            except Exception as exc:
                return CoreOutcome(ToolResult(f"{tool} failed: {exc!r}"[:2_000], "error"))
            return CoreOutcome(
                result if isinstance(result, ToolResult) else ToolResult(str(result))
            )
        return await self.core.run(tool, args, call_id, approved)


def _in_daemon_thread(fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
    """`fn(*args)` in a daemon thread of its own, as a future of the running loop. Not the
    loop's executor: a handler that never returns would hold the runner at its exit there
    (the executor is waited for, its threads joined) after the round's limit gave up on it,
    and a resident runner would lose one of its threads for good to each."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()
    context = contextvars.copy_context()

    def settle(value: T | None, error: BaseException | None) -> None:
        if done.done():  # given up on (the round's limit): the outcome goes nowhere
            return
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(cast("T", value))

    def work() -> None:
        try:
            value, error = context.run(fn, *args), None
        except BaseException as exc:  # handed to the awaiting task, as a call would raise it
            value, error = None, exc
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(settle, value, error)

    threading.Thread(target=work, name="toolpack-handler", daemon=True).start()
    return done
