"""Toolpack scheduler hooks: found through entry points (and settings), called with an agent's
state when one of its activations ended; a hook that raises, overruns or answers nonsense is
logged and skipped, and never stops scheduling."""

from __future__ import annotations

import asyncio
import importlib
import inspect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

from pydantic import TypeAdapter, ValidationError

from suzumio.contracts.scheduling import (
    HOOKS_ENTRY_POINT_GROUP,
    AgentSchedulingState,
    HookAction,
    SchedulerHook,
)
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


def load_hooks(extra: Iterable[str] = ()) -> list[NamedHook]:
    """Hooks registered under the `suzumio.scheduler_hooks` entry point group, then the
    `module:attribute` specs of `extra` (settings). One that cannot be loaded is logged."""
    found: list[NamedHook] = []
    for point in sorted(entry_points(group=HOOKS_ENTRY_POINT_GROUP), key=lambda p: p.name):
        try:
            found.append(NamedHook(point.name, point.load()))
        except Exception:
            log.exception("hooks.load_failed", hook=point.name)
    for spec in extra:
        module_name, _, attribute = spec.partition(":")
        try:
            found.append(NamedHook(spec, getattr(importlib.import_module(module_name), attribute)))
        except Exception:
            log.exception("hooks.load_failed", hook=spec)
    return found


class Hooks:
    def __init__(self, hooks: Sequence[NamedHook], *, timeout: float = 2.0) -> None:
        self.hooks = tuple(hooks)
        self._timeout = timeout

    async def run(self, state: AgentSchedulingState) -> list[tuple[str, HookAction]]:
        """Every hook's actions, in hook order; failing hooks contribute none."""
        actions: list[tuple[str, HookAction]] = []
        for hook in self.hooks:
            try:
                answer = await asyncio.wait_for(self._call(hook.call, state), self._timeout)
                actions += [(hook.name, a) for a in _ACTIONS.validate_python(list(answer or ()))]
            except TimeoutError:
                log.warning("hooks.timed_out", hook=hook.name, seconds=self._timeout)
                _calls.add(1, {"hook": hook.name, "outcome": "timeout"})
            except ValidationError as exc:
                log.warning("hooks.invalid_answer", hook=hook.name, error=str(exc)[:500])
                _calls.add(1, {"hook": hook.name, "outcome": "invalid"})
            except Exception as exc:
                log.warning("hooks.failed", hook=hook.name, error=repr(exc)[:500])
                _calls.add(1, {"hook": hook.name, "outcome": "error"})
            else:
                _calls.add(1, {"hook": hook.name, "outcome": "ok"})
        return actions

    @staticmethod
    async def _call(hook: SchedulerHook, state: AgentSchedulingState) -> Any:
        if inspect.iscoroutinefunction(hook):
            return await hook(state)
        # A plain function may block; it must not block the scheduler's loop.
        answer = await asyncio.to_thread(hook, state)
        return await answer if inspect.isawaitable(answer) else answer
