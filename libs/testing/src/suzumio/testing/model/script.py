"""The steps a scripted model plays, one per request, shared or kept per model name."""

from __future__ import annotations

import inspect
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeAlias

from suzumio.testing.model.replies import Reply, error_body

Responder: TypeAlias = Callable[[dict[str, Any]], Reply | Awaitable[Reply]]
"""A step computed from the request's JSON body (sync or async)."""

Step: TypeAlias = Reply | Responder


def script_exhausted(body: dict[str, Any]) -> Reply:
    """The default responder: a loud 500, so a test that asks more than it scripted fails."""
    message = (
        f"script exhausted: no scripted step left for model {body.get('model')!r}; "
        "script more steps or set a default responder"
    )
    return Reply.error(500, error_body(message, type_="server_error", code="script_exhausted"))


async def resolve(step: Step, body: dict[str, Any]) -> Reply:
    """The reply a step gives to this request; a responder that fails answers 500."""
    if isinstance(step, Reply):
        return step
    try:
        result = step(body)
        reply: object = await result if inspect.isawaitable(result) else result
    except Exception as exc:
        message = f"scripted responder {step!r} raised {type(exc).__name__}: {exc}"
        return Reply.error(500, error_body(message, type_="server_error", code="responder_failed"))
    if not isinstance(reply, Reply):
        message = f"scripted responder {step!r} returned {type(reply).__name__}, not a Reply"
        return Reply.error(500, error_body(message, type_="server_error", code="responder_failed"))
    return reply


class Script:
    """Queues of steps. A model name with a queue of its own takes steps only from it (and
    gets the default responder once it is empty); any other model takes the shared queue."""

    def __init__(self, default: Step = script_exhausted) -> None:
        self.default: Step = default
        self._shared: deque[Step] = deque()
        self._by_model: dict[str, deque[Step]] = {}

    def add(self, steps: Iterable[Step], model: str | None = None) -> None:
        if model is None:
            self._shared.extend(steps)
        else:
            self._by_model.setdefault(model, deque()).extend(steps)

    def next_step(self, model: str | None) -> Step:
        queue = self._by_model.get(model, self._shared) if model is not None else self._shared
        return queue.popleft() if queue else self.default

    def pending(self, model: str | None = None) -> int:
        queue = self._shared if model is None else self._by_model.get(model, deque())
        return len(queue)

    def models(self) -> list[str]:
        return sorted(self._by_model)
