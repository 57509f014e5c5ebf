"""Errors of the platform's mechanisms (not of the domain: those are in suzumio.contracts)."""

from __future__ import annotations


class PlatformError(RuntimeError):
    """Base of the platform's own failures."""


class JetStreamApiError(PlatformError):
    """A JetStream API request answered with an error."""

    def __init__(self, code: int, err_code: int, description: str) -> None:
        super().__init__(f"JetStream error {err_code} ({code}): {description}")
        self.code = code
        self.err_code = err_code
        self.description = description


class EmbeddedServerError(PlatformError):
    """An embedded NATS or Postgres server could not be started."""
