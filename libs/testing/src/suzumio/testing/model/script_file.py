"""The JSON form of a script, for model servers run as a process (`--script path.json`).

    {
      "steps":  [STEP, ...],                      # the shared queue
      "models": {"primary": [STEP, ...], ...},    # queues per model name
      "default": STEP                             # when a queue is empty (else a loud 500)
    }

A bare JSON list is the same as `{"steps": [...]}`. A STEP is one of:

    {"text": "hello", "finish_reason": "length"}
    {"tool_calls": [{"name": "file_read", "arguments": {"path": "a.txt"}, "id": "call_1"}],
     "text": "optional text sent with the calls"}
    {"error": "rate_limited", "retry_after": 2}        # a named error, see ERRORS
    {"error": "model_not_found", "model": "primary"}
    {"status": 502, "body": "<html>bad gateway</html>", "headers": {"X-A": "b"}}
    {"demo": true}                                     # the offline demo model answers

and may add `"usage": {"prompt_tokens": 10, "completion_tokens": 3, "cached_tokens": 0}`,
`"delay"` and `"chunk_delay"` (seconds), `"disconnect_after"` and `"end_after"` (chunks) and
`"headers"`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, model_validator

from suzumio.testing.model.demo import DemoModel
from suzumio.testing.model.replies import Reply, ToolCall, Usage
from suzumio.testing.model.script import Script, Step

ErrorName = Literal[
    "context_length_exceeded",
    "content_policy",
    "unauthorized",
    "forbidden",
    "model_not_found",
    "payload_too_large",
    "rate_limited",
    "server_error",
    "overloaded",
]
ERRORS: tuple[str, ...] = get_args(ErrorName)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class UsageSpec(_Strict):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0


class ToolCallSpec(_Strict):
    name: str
    arguments: dict[str, Any] | str = Field(default_factory=dict)
    id: str | None = None


class StepSpec(_Strict):
    text: str | None = None
    tool_calls: list[ToolCallSpec] | None = None
    finish_reason: str | None = None
    error: ErrorName | None = None
    retry_after: float | None = None
    model: str | None = None
    status: int | None = Field(default=None, ge=400, le=599)
    body: Any = None
    demo: bool = False
    usage: UsageSpec | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    delay: float = Field(default=0.0, ge=0)
    chunk_delay: float = Field(default=0.0, ge=0)
    disconnect_after: int | None = Field(default=None, ge=0)
    end_after: int | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _one_kind(self) -> StepSpec:
        kinds = [
            self.text is not None or self.tool_calls is not None,
            self.error is not None,
            self.status is not None,
            self.demo,
        ]
        if sum(kinds) != 1:
            raise ValueError("a step is exactly one of: text/tool_calls, error, status, demo")
        return self

    def to_step(self) -> Step:
        if self.demo:
            return DemoModel()
        if self.error is not None:
            return _named_error(self)
        if self.status is not None:
            return Reply.error(self.status, self.body, headers=self.headers, delay=self.delay)
        usage = Usage(**self.usage.model_dump()) if self.usage else None
        timing: dict[str, Any] = {
            "usage": usage,
            "delay": self.delay,
            "chunk_delay": self.chunk_delay,
            "headers": self.headers,
            "disconnect_after": self.disconnect_after,
            "end_after": self.end_after,
        }
        if self.tool_calls:
            calls = [ToolCall(c.name, c.arguments, c.id) for c in self.tool_calls]
            return Reply.tool_calls(calls, content=self.text, **timing)
        return Reply.text(self.text or "", finish_reason=self.finish_reason or "stop", **timing)


_PLAIN_ERRORS: dict[str, Callable[[], Reply]] = {
    "context_length_exceeded": Reply.context_length_exceeded,
    "content_policy": Reply.content_policy,
    "unauthorized": Reply.unauthorized,
    "forbidden": Reply.forbidden,
    "payload_too_large": Reply.payload_too_large,
    "server_error": Reply.server_error,
}


def _named_error(spec: StepSpec) -> Reply:
    if spec.error == "rate_limited":
        reply = Reply.rate_limited(1 if spec.retry_after is None else spec.retry_after)
    elif spec.error == "overloaded":
        reply = Reply.overloaded(spec.retry_after)
    elif spec.error == "model_not_found":
        reply = Reply.model_not_found(spec.model or "unknown")
    else:
        reply = _PLAIN_ERRORS[str(spec.error)]()
    return Reply.error(
        reply.status, reply.body, headers={**reply.headers, **spec.headers}, delay=spec.delay
    )


class ScriptSpec(_Strict):
    steps: list[StepSpec] = Field(default_factory=list)
    models: dict[str, list[StepSpec]] = Field(default_factory=dict)
    default: StepSpec | None = None

    def apply_to(self, script: Script) -> None:
        script.add(step.to_step() for step in self.steps)
        for model, steps in self.models.items():
            script.add((step.to_step() for step in steps), model=model)
        if self.default is not None:
            script.default = self.default.to_step()


def load_script(path: Path) -> ScriptSpec:
    """Read and validate a JSON script file (raises pydantic's ValidationError when wrong)."""
    data = json.loads(path.read_text())
    if isinstance(data, list):
        data = {"steps": data}
    return ScriptSpec.model_validate(data)
