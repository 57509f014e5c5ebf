"""Scheduler hooks: found through entry points (and settings), called for every agent, and in
installed toolpacks' manifests, called for the agents that enable the toolpack only; each is
called with the agent's state when one of its activations ended. A hook that raises, overruns
or answers nonsense is logged and skipped, and never stops scheduling (nor, hung, takes more
than a few threads)."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC
from importlib.metadata import entry_points
from typing import Any

from pydantic import TypeAdapter, ValidationError

from suzumio.contracts.commands import PostMessage, RecordSignal
from suzumio.contracts.ids import derived_id
from suzumio.contracts.scheduling import (
    HOOKS_ENTRY_POINT_GROUP,
    AgentSchedulingState,
    HookAction,
    HookSignal,
    SchedulerHook,
)
from suzumio.contracts.toolpacks import ToolpackManifest, resolve
from suzumio.platform.logging import get_logger
from suzumio.platform.telemetry import meter

log = get_logger(__name__)
_ACTIONS: TypeAdapter[list[HookAction]] = TypeAdapter(list[HookAction])
_calls = meter.create_counter(
    "suzumio_scheduler_hook_calls", description="scheduler hook calls by hook and outcome"
)


@dataclass(frozen=True)
class NamedHook:
    name: str
    call: SchedulerHook
    toolpacks: frozenset[str] | None = None
    """A toolpack's own hook (its manifest's `scheduler_hooks`; several toolpacks' when their
    manifests name the same one): called only for agents that enable one of them. None: for
    every agent."""

    def applies_to(self, toolpacks: Iterable[str]) -> bool:
        return self.toolpacks is None or not self.toolpacks.isdisjoint(toolpacks)


def load_hooks(
    extra: Iterable[str] = (), toolpacks: Mapping[str, ToolpackManifest] | None = None
) -> list[NamedHook]:
    """Hooks registered under the `suzumio.scheduler_hooks` entry point group, then the
    `module:attribute` specs of `extra` (settings), then those of `toolpacks`' manifests (by
    toolpack name, named `<toolpack>:<module:attribute>`). One that cannot be loaded is logged;
    one loaded already (a setting naming an entry point's hook, or the same one twice) is not
    loaded again.
    A toolpack's hook already loaded for every agent is not loaded again for its own; one
    several toolpacks name is loaded once, for the agents enabling any of them (so an agent
    enabling two is not called twice)."""
    found: list[NamedHook] = []
    for point in sorted(entry_points(group=HOOKS_ENTRY_POINT_GROUP), key=lambda p: p.name):
        try:
            found.append(NamedHook(point.name, point.load()))
        except Exception:
            log.exception("hooks.load_failed", hook=point.name)
    for spec in extra:
        with _logged(spec):
            call = _resolved(spec)
            # Registered as an entry point and named in the settings too: called once (twice,
            # each name derives its own ids, and every end got each action twice).
            if any(hook.call == call for hook in found):
                log.info("hooks.already_loaded", hook=spec)
                continue
            found.append(NamedHook(spec, call))
    for pack, manifest in sorted((toolpacks or {}).items()):
        for spec in manifest.scheduler_hooks:
            name = f"{pack}:{spec}"
            with _logged(name):
                call = _resolved(spec)
                # `==`, not `is`: each lookup of a method makes a new bound method.
                at = next((i for i, hook in enumerate(found) if hook.call == call), None)
                if at is None:
                    found.append(NamedHook(name, call, toolpacks=frozenset({pack})))
                    continue
                loaded = found[at]
                if loaded.toolpacks is None:
                    log.info("hooks.already_for_every_agent", hook=name)
                else:  # another toolpack's too
                    found[at] = replace(loaded, toolpacks=loaded.toolpacks | {pack})
    return found


def _resolved(spec: str) -> SchedulerHook:
    """`module:attribute`, the attribute perhaps dotted, as the manifest's handlers are."""
    call: SchedulerHook = resolve(spec)
    return call


@contextlib.contextmanager
def _logged(name: str) -> Iterator[None]:
    try:
        yield
    except Exception:
        log.exception("hooks.load_failed", hook=name)


class Hooks:
    def __init__(self, hooks: Sequence[NamedHook], *, timeout: float = 2.0) -> None:
        self.hooks = tuple(hooks)
        self._timeout = timeout
        self._threads = _HookThreads()
        self._lingering: dict[str, int] = {}  # calls past their time, still going, by hook

    def any_for(self, toolpacks: tuple[str, ...]) -> bool:
        """Whether any hook is called for an agent enabling `toolpacks`."""
        return any(hook.applies_to(toolpacks) for hook in self.hooks)

    async def run(self, state: AgentSchedulingState) -> list[tuple[str, HookAction]]:
        """Every hook's actions, in hook order; failing hooks contribute none."""
        actions: list[tuple[str, HookAction]] = []
        for hook in self.hooks:
            if not hook.applies_to(state.toolpacks):
                continue
            try:
                answer = _validated(await self._bounded(hook, state))
                actions += [(hook.name, a) for a in answer]
            except TimeoutError:
                log.warning("hooks.timed_out", hook=hook.name, seconds=self._timeout)
                _calls.add(1, {"hook": hook.name, "outcome": "timeout"})
            except (ValidationError, _TooManyActionsError) as exc:
                log.warning("hooks.invalid_answer", hook=hook.name, error=str(exc)[:500])
                _calls.add(1, {"hook": hook.name, "outcome": "invalid"})
            except Exception as exc:
                log.warning("hooks.failed", hook=hook.name, error=repr(exc)[:500])
                _calls.add(1, {"hook": hook.name, "outcome": "error"})
            else:
                _calls.add(1, {"hook": hook.name, "outcome": "ok"})
        return actions

    async def _bounded(self, hook: NamedHook, state: AgentSchedulingState) -> list[Any]:
        """The hook's answer within the timeout. A call past it is cancelled and not waited
        for: `wait_for` would wait for the cancel to take effect, and a hook that takes its
        time cleaning up (or swallows the cancel) would hold the review — and every later
        review of the session — as long as it likes. Such calls are counted, and a hook with
        `THREADS_PER_HOOK` of them still going is not called again until one ends."""
        if self._lingering.get(hook.name, 0) >= THREADS_PER_HOOK:
            raise TimeoutError  # its earlier calls still run past their time
        task = asyncio.ensure_future(self._call(hook, state))
        try:
            done, _ = await asyncio.wait({task}, timeout=self._timeout)
        except BaseException:  # the review itself is cancelled (shutdown): so is the call
            task.cancel()
            raise
        if task in done:
            if task.cancelled():  # by the hook itself: its failure, not the review's to die of
                raise RuntimeError("the hook's call was cancelled")
            return task.result()
        task.cancel()
        self._lingering[hook.name] = self._lingering.get(hook.name, 0) + 1

        def ended(t: asyncio.Task[list[Any]]) -> None:
            self._lingering[hook.name] -= 1
            if not t.cancelled():
                t.exception()  # retrieved: nobody waits for it any more

        task.add_done_callback(ended)
        raise TimeoutError

    async def _call(self, hook: NamedHook, state: AgentSchedulingState) -> list[Any]:
        if inspect.iscoroutinefunction(hook.call):
            return _listed(await hook.call(state))
        # A plain function may block; it must not block the scheduler's loop. Nor may the
        # generator it may return, whose body runs only as it is read: read in the thread.
        answer = await self._threads.run(hook.name, hook.call, state)
        return _listed(await answer) if inspect.isawaitable(answer) else _listed(answer)


MAX_ACTIONS = 100
"""Actions one hook call may ask for: each is a command the review sends, one after the other,
while the session waits for its review; an answer with more (or an endless generator) is
nonsense and skipped whole."""


class _TooManyActionsError(ValueError):
    pass


def _validated(answer: list[Any]) -> list[HookAction]:
    if len(answer) > MAX_ACTIONS:
        raise _TooManyActionsError(f"more than {MAX_ACTIONS} actions")
    return _ACTIONS.validate_python(answer)


def _listed(answer: Any) -> list[Any]:
    """An answer as a list, reading no more than one item past `MAX_ACTIONS`."""
    if answer is None:
        return []
    if isinstance(answer, list):
        return answer
    return list(itertools.islice(answer, MAX_ACTIONS + 1))


def action_command(
    session_id: str, ended_activation_id: str, hook_name: str, action: HookAction
) -> RecordSignal | PostMessage:
    """A hook's action as a command to the session service, with ids derived from the ended
    activation, the hook and the action's key: repeated, it is recorded once. Raises
    ValidationError when the command refuses it (a payload too large, a time out of range)."""
    signal_id = derived_id("hook.signal", ended_activation_id, hook_name, action.key)
    if isinstance(action, HookSignal):
        not_before = action.not_before
        if not_before is not None and not_before.tzinfo is None:
            # A hook's time may be naive (its contract takes any datetime), the command's
            # must not be: read as UTC, as the fold reads one from the log (model.Signal).
            not_before = not_before.replace(tzinfo=UTC)
        return RecordSignal(
            session_id=session_id,
            signal_id=signal_id,
            kind=action.kind,
            priority=action.priority,
            payload={**action.payload, "hook": hook_name},
            not_before=not_before,
        )
    return PostMessage(
        session_id=session_id,
        message_id=derived_id("hook.message", ended_activation_id, hook_name, action.key),
        signal_id=signal_id,
        text=action.text,
        priority=action.priority,
    )


THREADS_PER_HOOK = 4
"""Calls of one plain-function hook running at once: reviews of several sessions overlap, and
a slow hook (a database query) must serve them all; a hung one holds at most this many."""


class _HookThreads:
    """Where plain-function hooks run: a thread of their own per call, at most
    `THREADS_PER_HOOK` at once per hook; a call waits for a free one within its timeout.

    Not the loop's default executor: a call that overran its timeout goes on in its thread
    (a thread cannot be stopped), and a few hung hooks would take every worker of that pool,
    after which the loop's own blocking work (getaddrinfo for a NATS reconnect or a Postgres
    connection) waited forever. Here hung calls never number more than `THREADS_PER_HOOK` a
    hook: the next ones time out waiting. The threads are daemons, so a hung one does not
    hold the process at exit either (a ThreadPoolExecutor's would)."""

    def __init__(self) -> None:
        self._slots: dict[str, asyncio.Semaphore] = {}

    async def run(self, name: str, call: SchedulerHook, state: AgentSchedulingState) -> Any:
        slots = self._slots.setdefault(name, asyncio.Semaphore(THREADS_PER_HOOK))
        await slots.acquire()  # under the caller's timeout
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[Any] = loop.create_future()

        def settle(result: Any, error: BaseException | None) -> None:
            slots.release()  # the thread is done, whether anyone still waits or not
            if answer.done():
                return  # timed out and cancelled meanwhile: nobody waits any more
            if error is None:
                answer.set_result(result)
            else:
                answer.set_exception(error)

        def work() -> None:
            result: Any = None
            error: BaseException | None = None
            try:
                result = call(state)
                if not inspect.isawaitable(result):
                    result = _listed(result)  # a generator's body is the hook's code too
            except BaseException as exc:  # handed to the caller, which logs it
                error = exc
            with contextlib.suppress(RuntimeError):  # the loop closed while it ran
                loop.call_soon_threadsafe(settle, result, error)

        try:
            threading.Thread(target=work, name=f"scheduler-hook:{name}", daemon=True).start()
        except BaseException:
            slots.release()
            raise
        return await answer
