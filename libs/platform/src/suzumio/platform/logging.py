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


# Names of fields (and of HTTP headers, query parameters, span attributes) whose value is a
# secret, in snake, kebab, dotted or camel case: `api_key`, `X-API-Key`, `accessToken`.
_SECRET_FIELD = re.compile(
    r"(^|[_.\s-])(secret|password|passwd|passphrase|token|api[-_]?key|authorization|cookie"
    r"|credentials?|dsn)($|[_.\s-])",
    re.IGNORECASE,
)
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
# Secrets by their shape: Suzumio API keys, provider keys (not the end of `task-...`), sealed
# secrets, activation tokens, Fernet keys (the platform's secret key).
_SHAPED = re.compile(
    r"szm_[A-Za-z0-9]+_[A-Za-z0-9_-]{16,}|(?<![A-Za-z0-9])sk-[A-Za-z0-9_-]{16,}|gAAAAA[A-Za-z0-9_=-]{20,}"
    r"|sza1\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+"
)
# A Fernet key is 43 URL-safe base64 characters and `=`; found by its `=` (a literal the
# search skips to), looking back: trying every position of a long text would be slow.
_FERNET_KEY_END = re.compile(r"=(?<=(?<![A-Za-z0-9_-])[A-Za-z0-9_-]{43}=)(?![A-Za-z0-9_=-])")
_FERNET_KEY_LENGTH = 44
# Secrets by where they stand: a URL's credentials (`postgresql://user:PASSWORD@`,
# `nats://TOKEN@`: nats-py takes a lone user as the token), a secret-named parameter
# (`?access_token=`, the WebSocket's way in, which uvicorn logs with the path; `password=` of a
# libpq DSN), the credential after an authorization scheme (`Bearer ...`).
# The scheme is bounded and needs no word boundary before it: with `\b` and an unbounded
# scheme, a text like `a.a.a.a...://x@` was tried from every letter to the end of the run
# (quadratic: 100 KB held the event loop for seconds), and a scheme glued to a word
# (`DATABASE_URLpostgresql://`, `1http://`) was not seen at all, its password kept.
_USERINFO = re.compile(r"([A-Za-z][A-Za-z0-9+.-]{0,31}://)([^\s/?#'\"<>]*)@")
_PARAMETER = re.compile(
    r"((?:(?<=[?&;])(?:key|sig|signature|auth|code)"
    r"|\b(?:(?:access|refresh|auth|id)_token|token|api_?key|apikey|password|passwd|secret"
    r"|secret_key|client_secret))=)[^\s&#'\"<>]+",
    re.IGNORECASE,
)
_CREDENTIAL = re.compile(r"\b((?:bearer|basic|token)\s+)[A-Za-z0-9._~+/-]{16,}=*", re.IGNORECASE)
_PARAMETER_HINTS = ("key", "sig", "auth", "code", "token", "pass", "secret")
_CREDENTIAL_HINTS = ("bearer", "basic", "token")
_TOKEN_SCHEMES = frozenset({"nats", "tls", "ws", "wss"})  # where a lone user is a token
REDACTED = "<redacted>"


def _userinfo(match: re.Match[str]) -> str:
    scheme, userinfo = match[1], match[2]
    user, has_password, _ = userinfo.partition(":")
    if has_password:
        return f"{scheme}{user}:{REDACTED}@"
    if userinfo and scheme[:-3].lower() in _TOKEN_SCHEMES:
        return f"{scheme}{REDACTED}@"
    return match[0]


def _fernet_keys(text: str) -> str:
    parts: list[str] = []
    last = 0
    for match in _FERNET_KEY_END.finditer(text):
        parts += (text[last : match.end() - _FERNET_KEY_LENGTH], REDACTED)
        last = match.end()
    return "".join((*parts, text[last:])) if parts else text


def redact_text(text: str) -> str:
    """`text` with anything that looks like a secret, or stands where secrets do, replaced.

    Each pattern runs only when the text has what it needs (an `=`, a `://`, a scheme's
    name): every string of every log line comes through here, most with none of it."""
    text = _SHAPED.sub(REDACTED, text)
    if "://" in text and "@" in text:
        text = _USERINFO.sub(_userinfo, text)
    lowered = text.lower()
    if "=" in text:
        if any(hint in lowered for hint in _PARAMETER_HINTS):
            text = _PARAMETER.sub(rf"\1{REDACTED}", text)
        text = _fernet_keys(text)
    if any(hint in lowered for hint in _CREDENTIAL_HINTS):
        text = _CREDENTIAL.sub(rf"\1{REDACTED}", text)
    return text


def secret_name(name: str) -> bool:
    """Whether a field, header, parameter or attribute called `name` holds a secret."""
    return bool(_SECRET_FIELD.search(_CAMEL.sub("_", name)))


_PLAIN = (int, float, bool, type(None))


def _scrub(value: Any, depth: int = 0) -> Any:
    """`value` with secret-named keys and key-shaped strings redacted, nested values too."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, _PLAIN):
        return value
    if depth > 8:  # deeper than any log field we write: do not walk cycles
        return value
    if isinstance(value, Mapping):
        return {
            k: REDACTED if isinstance(k, str) and secret_name(k) else _scrub(v, depth + 1)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple | set | frozenset):
        return [_scrub(v, depth + 1) for v in value]
    return _scrub_repr(value)


def _scrub_repr(value: Any) -> Any:
    """Anything else the renderer shows as its repr (an exception, a URL object, a model):
    what it shows must be redacted too; untouched when there is nothing to redact."""
    try:
        shown = repr(value)
    except Exception:  # the renderer will say what is wrong with it; no secret shown here
        return value
    redacted = redact_text(shown)
    return value if redacted == shown else redacted


def _redact(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """Keep secrets out of logs: fields named like secrets, and key-shaped strings anywhere,
    including inside nested values and formatted tracebacks (so it runs after
    `format_exc_info`)."""
    for key, value in list(event.items()):
        if isinstance(key, str) and key != "event" and secret_name(key):
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
