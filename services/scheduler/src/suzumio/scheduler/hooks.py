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
        started = asyncio.Event()
        task = asyncio.ensure_future(self._call(hook, state, started))
        try:
            if not inspect.iscoroutinefunction(hook.call):
                # Its time counts from when it has a thread: a burst of reviews (a leader that
                # took over reviews every recent end at once) queues for the hook's threads,
                # and counted while queued, most timed out unasked — their sessions nudged as
                # if no hook had acted. (Queued no longer once all its threads hang.)
                waiting = asyncio.ensure_future(started.wait())
                try:
                    await asyncio.wait({task, waiting}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    waiting.cancel()
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

    async def _call(
        self, hook: NamedHook, state: AgentSchedulingState, started: asyncio.Event
    ) -> list[Any]:
        try:
            if inspect.iscoroutinefunction(hook.call):
                return _listed(await hook.call(state))
            # A plain function may block; it must not block the scheduler's loop. Nor may the
            # generator it may return, whose body runs only as it is read: read in the thread.
            answer = await self._threads.run(hook.name, hook.call, state, started)
            return _listed(await answer) if inspect.isawaitable(answer) else _listed(answer)
        except (SystemExit, KeyboardInterrupt, GeneratorExit) as exc:
            raise _tamed(exc) from None


def _tamed(exc: BaseException) -> Exception:
    """A hook's `sys.exit()` (a command-line helper's way to fail) as the failure it is: out
    of a task, asyncio raises `SystemExit` and `KeyboardInterrupt` out of the event loop —
    the scheduler would stop for every project, and again on each restart as the new leader
    reviews the same ends."""
    return RuntimeError(f"the hook raised {type(exc).__name__}({exc})")


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
LINGER_CHECK_SECONDS = 0.5  # a call waiting for a hook's thread looks this often whether all hang
"""Calls of one plain-function hook running at once: reviews of several sessions overlap, and
a slow hook (a database query) must serve them all; a hung one holds at most this many."""


class _HookThreads:
    """Where plain-function hooks run: a thread of their own per call, at most
    `THREADS_PER_HOOK` at once per hook; a call waits for a free one before its timeout starts,
    for as long as the hook's threads run calls within their time.

    Not the loop's default executor: a call that overran its timeout goes on in its thread
    (a thread cannot be stopped), and a few hung hooks would take every worker of that pool,
    after which the loop's own blocking work (getaddrinfo for a NATS reconnect or a Postgres
    connection) waited forever. Here hung calls never number more than `THREADS_PER_HOOK` a
    hook: the next ones time out waiting. The threads are daemons, so a hung one does not
    hold the process at exit either (a ThreadPoolExecutor's would)."""

    def __init__(self) -> None:
        self._busy: dict[str, int] = {}  # threads running the hook's calls
        self._freed: dict[str, asyncio.Event] = {}  # set as one of them ends
        self._abandoned: dict[str, int] = {}  # threads still running calls given up on

    async def _slot(self, name: str) -> None:
        """A thread's slot of the hook's (taken: `_release` gives it back), waited for while
        its threads are busy, given up on once every one runs an abandoned call."""
        while True:
            if self._abandoned.get(name, 0) >= THREADS_PER_HOOK:
                raise TimeoutError
            if self._busy.get(name, 0) < THREADS_PER_HOOK:
                self._busy[name] = self._busy.get(name, 0) + 1
                return
            freed = self._freed.setdefault(name, asyncio.Event())
            freed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(freed.wait(), LINGER_CHECK_SECONDS)

    def _release(self, name: str) -> None:
        self._busy[name] -= 1
        if (freed := self._freed.get(name)) is not None:
            freed.set()

    async def run(
        self, name: str, call: SchedulerHook, state: AgentSchedulingState, started: asyncio.Event
    ) -> Any:
        """`call` in a thread of its own once the hook has one free (`started` set then).
        Waiting gives up (TimeoutError) once every thread of the hook runs a call its caller
        gave up on (past its time): those may never end."""
        await self._slot(name)
        started.set()
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[Any] = loop.create_future()

        def settle(result: Any, error: BaseException | None) -> None:
            self._release(name)  # the thread is done, whether anyone still waits or not
            if answer.done():  # timed out and cancelled meanwhile: nobody waits any more
                # (Counted up by the caller's cancel, which may run after this.)
                self._abandoned[name] = self._abandoned.get(name, 0) - 1
                return
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
                error = exc if isinstance(exc, Exception) else _tamed(exc)
            with contextlib.suppress(RuntimeError):  # the loop closed while it ran
                loop.call_soon_threadsafe(settle, result, error)

        try:
            threading.Thread(target=work, name=f"scheduler-hook:{name}", daemon=True).start()
        except BaseException:
            self._release(name)
            raise
        try:
            return await answer
        except asyncio.CancelledError:
            if answer.cancelled():  # its thread goes on: `settle` counts it back
                self._abandoned[name] = self._abandoned.get(name, 0) + 1
            raise
