"""Failures a person at a terminal can act on: one line naming what is wrong, an exit code,
no traceback (a traceback says "bug"; a wrong URL or setting is not one)."""

from __future__ import annotations

from typing import NoReturn

import typer
from pydantic import ValidationError

from suzumio.platform.embedded.credentials import redact
from suzumio.platform.settings import PlatformSettings

__all__ = ["CONNECT_WITHIN", "fail", "first_line", "load_settings", "redact"]

CONNECT_WITHIN = 5.0  # seconds a command waits for NATS or Postgres before giving up


def fail(message: str, code: int = 1) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def load_settings() -> PlatformSettings:
    """The settings from the environment, or exit 2 naming each variable that is wrong."""
    try:
        return PlatformSettings()
    except ValidationError as exc:
        prefix = PlatformSettings.model_config.get("env_prefix", "")
        problems = [
            f"{prefix}{str(error['loc'][0]).upper() if error['loc'] else ''}: {error['msg']}"
            f" (got {_shown(error['input'])!r})"
            for error in exc.errors()
        ]
        fail("; ".join(problems), code=2)


def _shown(value: object) -> object:
    """A rejected setting as we echo it: a URL's password or token masked."""
    return redact(value) if isinstance(value, str) else value
