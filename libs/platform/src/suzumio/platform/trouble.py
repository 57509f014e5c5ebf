"""The platform's servers in trouble, whatever raised it: a failure that says nothing about the
request (NATS or Postgres slow, restarting or unreachable; a stream electing its leader), which
may pass when asked again — a 503 `unavailable` to the API's clients, never a 500. A refusal
of the request itself is not trouble."""

from __future__ import annotations

from suzumio.platform.bus.direct_get import DirectGetError
from suzumio.platform.bus.jsapi import ERR_STREAM_NOT_FOUND
from suzumio.platform.bus.trouble import NATS_TROUBLE
from suzumio.platform.db.trouble import POSTGRES_SUSPECTS, POSTGRES_TROUBLE, is_postgres_trouble
from suzumio.platform.errors import JetStreamApiError

TROUBLE: tuple[type[Exception], ...] = (*POSTGRES_TROUBLE, TimeoutError, *NATS_TROUBLE)


def is_trouble(exc: BaseException) -> bool:
    """The platform's servers in trouble (to retry), not a failure of ours."""
    if isinstance(exc, JetStreamApiError):
        return jetstream_trouble(exc)
    if isinstance(exc, DirectGetError):
        return exc.passes
    return isinstance(exc, TROUBLE) or (
        isinstance(exc, POSTGRES_SUSPECTS) and is_postgres_trouble(exc)
    )


def jetstream_trouble(exc: JetStreamApiError) -> bool:
    """A JetStream API error reply that passes: the server's own (5xx: no leader, short of
    resources), or a stream not there yet (LIVE is made again within seconds of a NATS
    restart that lost it). Any other is a request of ours the server refused: a bug."""
    return exc.code >= 500 or exc.err_code == ERR_STREAM_NOT_FOUND
