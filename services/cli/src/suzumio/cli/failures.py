"""Failures a person at a terminal can act on: one line naming what is wrong, an exit code,
no traceback (a traceback says "bug"; a wrong URL or setting is not one)."""

from __future__ import annotations

from typing import NoReturn
from urllib.parse import urlsplit, urlunsplit

import typer
from pydantic import ValidationError

from suzumio.platform.settings import PlatformSettings

CONNECT_WITHIN = 5.0  # seconds a command waits for NATS or Postgres before giving up


def fail(message: str, code: int = 1) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def redact(url: str) -> str:
    """`url` without its password, fit for an error message."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = f"{parts.username}:***@" if parts.username else ":***@"
    return urlunsplit(parts._replace(netloc=user + netloc))


def load_settings() -> PlatformSettings:
    """The settings from the environment, or exit 2 naming each variable that is wrong."""
    try:
        return PlatformSettings()
    except ValidationError as exc:
        prefix = PlatformSettings.model_config.get("env_prefix", "")
        problems = [
            f"{prefix}{str(error['loc'][0]).upper() if error['loc'] else ''}: {error['msg']}"
            f" (got {error['input']!r})"
            for error in exc.errors()
        ]
        fail("; ".join(problems), code=2)
