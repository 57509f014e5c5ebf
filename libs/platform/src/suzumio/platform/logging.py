"""structlog, configured once per process: JSON lines unless a person is watching a terminal."""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Mapping, MutableMapping
from typing import Any, Literal

import structlog
from opentelemetry import trace


def _add_trace_ids(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    ctx = trace.get_current_span().get_span_context()
    if ctx.is_valid:
        event.setdefault("trace_id", format(ctx.trace_id, "032x"))
        event.setdefault("span_id", format(ctx.span_id, "016x"))
    return event


_SECRET_FIELD = re.compile(
    r"(^|_)(secret|password|passwd|token|api_?key|authorization|cookie)($|_)", re.IGNORECASE
)
_SECRET_TEXT = re.compile(
    r"(szm_[A-Za-z0-9]+_[A-Za-z0-9_-]{16,}|sk-[A-Za-z0-9_-]{16,}|gAAAAA[A-Za-z0-9_=-]{20,})"
)
REDACTED = "<redacted>"


def redact_text(text: str) -> str:
    """`text` with anything that looks like a Suzumio API key, a provider key or a sealed
    secret replaced."""
    return _SECRET_TEXT.sub(REDACTED, text)


def _scrub(value: Any, depth: int = 0) -> Any:
    """`value` with secret-named keys and key-shaped strings redacted, nested values too."""
    if isinstance(value, str):
        return redact_text(value)
    if depth > 8:  # deeper than any log field we write: do not walk cycles
        return value
    if isinstance(value, Mapping):
        return {
            k: REDACTED if isinstance(k, str) and _SECRET_FIELD.search(k) else _scrub(v, depth + 1)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple | set | frozenset):
        return [_scrub(v, depth + 1) for v in value]
    return value


def _redact(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """Keep secrets out of logs: fields named like secrets, and key-shaped strings anywhere,
    including inside nested values and formatted tracebacks (so it runs after
    `format_exc_info`)."""
    for key, value in list(event.items()):
        if isinstance(key, str) and key != "event" and _SECRET_FIELD.search(key):
            event[key] = REDACTED
        else:
            event[key] = _scrub(value)
    return event


def configure_logging(
    service: str,
    *,
    level: str = "info",
    fmt: Literal["auto", "json", "console"] = "auto",
    **bound: Any,
) -> None:
    """Route structlog and the standard library's logging to stderr, with `service` bound."""
    numeric = logging.getLevelNamesMapping()[level.upper()]
    as_json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        _add_trace_ids,
    ]
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer() if as_json else structlog.dev.ConsoleRenderer()
    )
    structlog.configure(
        processors=[
            *shared,
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            _redact,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )
    structlog.contextvars.clear_contextvars()
    structlog.contextvars.bind_contextvars(service=service, **bound)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[*shared, structlog.stdlib.add_logger_name],
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                _redact,
                renderer,
            ],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(max(numeric, logging.INFO))
    for noisy in ("uvicorn.access", "nats", "asyncio"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def get_logger(name: str | None = None, **bound: Any) -> structlog.stdlib.BoundLogger:
    logger: structlog.stdlib.BoundLogger = structlog.get_logger(name, **bound)
    return logger
