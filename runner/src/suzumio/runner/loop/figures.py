"""The figures of the agent loop that depend on the model being called (DESIGN.md
Appendix A): its output cap and its compaction threshold, from the model's own spec where it
gives them and the runner configuration's platform defaults where it does not; and how long a
tool round gives a call that has a time limit of its own.
"""

from __future__ import annotations

from collections.abc import Iterable

from suzumio.contracts.runner import RunnerConfig
from suzumio.contracts.values import ModelSpec
from suzumio.runner.loop import compaction

CALL_MARGIN_SECONDS = 30.0
"""Given to a call with a time limit of its own beyond that limit: its audit records go to the
broker (with retries), and a command killed at its timeout is reaped and its output read."""


def window(model: ModelSpec, config: RunnerConfig) -> int:
    """The model's context window in tokens."""
    return model.context_window or config.context_window


def output_tokens(model: ModelSpec, config: RunnerConfig) -> tuple[int, int]:
    """The output cap a call to `model` starts with, and the most a reply cut off by it may be
    asked again with. A model's own `max_output_tokens` is both: it is what the model can
    write. Else the platform's (4,096 doubled up to 32,768), at most half the model's window,
    so a small model is never asked for more than it can hold."""
    if model.max_output_tokens is not None:
        return model.max_output_tokens, model.max_output_tokens
    half = window(model, config) // 2
    first = min(config.max_output_tokens, half)
    return first, max(first, min(config.max_output_tokens_cap, half))


def threshold(model: ModelSpec, config: RunnerConfig) -> int:
    """The prompt size (tokens) at which the loop compacts before calling `model`: the ratio of
    its window less the output a call reserves — at most half the window, so a cap set near
    the window never makes every turn compact."""
    size = window(model, config)
    reserved = min(output_tokens(model, config)[0], size // 2)
    return compaction.threshold_tokens(size, reserved, config.compaction.threshold_ratio)


def round_allowances(own_seconds: Iterable[tuple[int, float]]) -> dict[int, float]:
    """The time a tool round must give each call that has a limit of its own (by call index):
    that limit plus a margin. Calls without one (0) are bound by the round's limit alone."""
    return {index: own + CALL_MARGIN_SECONDS for index, own in own_seconds if own > 0}
