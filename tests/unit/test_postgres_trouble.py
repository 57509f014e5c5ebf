"""asyncpg's InterfaceError (and InternalClientError) is Postgres trouble only when it is a lost
connection. Counted as trouble whole, a bug of ours (a connection used by two tasks at once, one
used after its release to the pool) was a retryable 503 for good in the gateway and the broker,
never parked in the projector, and contended again for ever by a leader. The errors are asyncpg's
own classes with the messages asyncpg raises them with (asyncpg 0.32: `Connection._check_open`,
`Protocol._check_state`, `CoreProtocol._set_state`, the pool's connection proxy); the gateway's
handlers, `apply_entries` and `Leadership` are the real ones."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from types import SimpleNamespace
from typing import Any, ClassVar

import asyncpg
import httpx
import pytest
from fastapi import FastAPI
from structlog.testing import capture_logs

from suzumio.gateway.api.problems import HANDLERS
from suzumio.platform.db import leadership
from suzumio.platform.db.leadership import Leadership
from suzumio.platform.db.trouble import is_postgres_trouble
from suzumio.platform.projections.apply import PoisonTracker, RetryBatchError, apply_entries
from suzumio.platform.projections.base import Events, Projection
from suzumio.platform.projections.decoding import LogEntry
from suzumio.toolbroker.problems import HANDLERS as BROKER_HANDLERS

Made = Callable[[], Exception]

# A connection used by two tasks at once; used after it went back to the pool; a statement
# given one argument too many; asyncpg's protocol code at fault.
BUGS: dict[str, Made] = {
    "concurrent use": lambda: asyncpg.InterfaceError(
        "cannot perform operation: another operation is in progress"
    ),
    "used after release": lambda: asyncpg.InterfaceError(
        "cannot call Connection.fetch(): connection has been released back to the pool"
    ),
    "arguments miscounted": lambda: asyncpg.InterfaceError(
        "the server expects 1 argument for this query, 2 were passed"
    ),
    "protocol fault": lambda: asyncpg.InternalClientError(
        "unknown error in protocol implementation"
    ),
}
# The server ended the connection: mid-statement; while it lay idle, found by the next
# statement before asyncpg saw it closed, or after; a transaction's rollback on it.
LOSSES: dict[str, Made] = {
    "cut mid-statement": lambda: asyncpg.ConnectionDoesNotExistError(
        "connection was closed in the middle of operation"
    ),
    "cut while idle, unseen": lambda: asyncpg.InternalClientError(
        "cannot switch to state 11; another operation (2) is in progress"
    ),
    "cut while idle, seen": lambda: asyncpg.InterfaceError("connection is closed"),
    "rollback on the cut": lambda: asyncpg.InterfaceError(
        "cannot perform operation: connection is closed"
    ),
    "server shut down": lambda: asyncpg.AdminShutdownError(
        "terminating connection due to administrator command"
    ),
    "refused": lambda: ConnectionRefusedError(111, "Connection refused"),
}


@pytest.mark.parametrize("made", BUGS.values(), ids=BUGS.keys())
def test_a_bug_shaped_client_error_is_not_trouble(made: Made) -> None:
    assert not is_postgres_trouble(made())


@pytest.mark.parametrize("made", LOSSES.values(), ids=LOSSES.keys())
def test_a_lost_connection_is_trouble(made: Made) -> None:
    assert is_postgres_trouble(made())


# -- the gateway (and the tool-broker, which answers as it does) ---------------------------------
@contextlib.asynccontextmanager
async def raising(handlers: Any, made: Made) -> AsyncIterator[httpx.AsyncClient]:
    app = FastAPI(exception_handlers=handlers)

    @app.get("/thing")
    async def thing() -> None:
        raise made()

    # As a server does: a failure past the handlers is answered (500), not raised to the client.
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
        yield client


@pytest.mark.parametrize("made", BUGS.values(), ids=BUGS.keys())
async def test_the_gateway_answers_a_bug_shaped_client_error_500_with_its_traceback(
    made: Made,
) -> None:
    with capture_logs() as logs:
        async with raising(HANDLERS, made) as client:
            answer = await client.get("/thing")
    assert answer.status_code == 500, answer.text
    assert answer.json()["code"] == "internal"
    assert "retry-after" not in answer.headers
    [logged] = [r for r in logs if r["event"] == "api.unexpected_error"]
    assert isinstance(logged["exc_info"], type(made()))  # logged with it: its traceback


@pytest.mark.parametrize("made", LOSSES.values(), ids=LOSSES.keys())
async def test_the_gateway_answers_a_lost_connection_503(made: Made) -> None:
    with capture_logs() as logs:
        async with raising(HANDLERS, made) as client:
            answer = await client.get("/thing")
    assert answer.status_code == 503, answer.text
    assert answer.json()["code"] == "unavailable"
    assert answer.headers["retry-after"] == "1"
    assert not [r for r in logs if r["event"] == "api.unexpected_error"]


@pytest.mark.parametrize(
    ("made", "status"),
    [(BUGS["concurrent use"], 500), (LOSSES["cut while idle, seen"], 503)],
    ids=["bug", "loss"],
)
async def test_the_broker_tells_them_apart_too(made: Made, status: int) -> None:
    async with raising(BROKER_HANDLERS, made) as client:
        answer = await client.get("/thing")
    assert answer.status_code == status, answer.text


# -- the projector ---------------------------------------------------------------------------
class Failing(Projection):
    name: ClassVar[str] = "failing"
    version: ClassVar[int] = 1
    handles: ClassVar[frozenset[str]] = frozenset({"thing.happened"})
    tables: ClassVar[tuple[str, ...]] = ()

    def __init__(self, made: Made) -> None:
        self.made = made

    def ddl(self, schema: str) -> str:
        return ""

    async def apply(self, conn: Any, schema: str, events: Events) -> None:
        raise self.made()


class Savepoints:
    """A connection as `apply_entries` uses it: savepoints that roll back what raised."""

    @contextlib.asynccontextmanager
    async def _savepoint(self) -> AsyncIterator[None]:
        yield

    def transaction(self) -> contextlib.AbstractAsyncContextManager[None]:
        return self._savepoint()


ENTRY = LogEntry(
    seq=7,
    subject="events.thing.t1",
    types=("thing.happened",),
    events=(SimpleNamespace(type="thing.happened", seq=7, id="e7"),),  # type: ignore[arg-type]
)


async def attempts(made: Made, times: int) -> list[object]:
    """What each of `times` applications of the batch ended with (as the live projector
    retries it: the same tracker)."""
    tracker = PoisonTracker()
    ended: list[object] = []
    for _ in range(times):
        try:
            ended.append(
                await apply_entries(Savepoints(), Failing(made), "s", [ENTRY], tracker)  # type: ignore[arg-type]
            )
        except Exception as exc:  # noqa: BLE001 - what it raised is the result
            ended.append(exc)
    return ended


@pytest.mark.parametrize("made", BUGS.values(), ids=BUGS.keys())
async def test_the_projector_parks_an_event_its_projection_fails_on_with_a_client_error(
    made: Made,
) -> None:
    first, second, third = await attempts(made, 3)
    assert isinstance(first, RetryBatchError)
    assert isinstance(second, RetryBatchError)
    assert isinstance(third, list)
    [parked] = third
    assert (parked.projection, parked.seq) == ("failing", 7)
    assert type(made()).__name__ in parked.error


@pytest.mark.parametrize("made", LOSSES.values(), ids=LOSSES.keys())
async def test_the_projector_never_parks_an_event_for_a_lost_connection(made: Made) -> None:
    ended = await attempts(made, 5)
    assert all(type(e) is type(made()) for e in ended), ended  # the batch's, to retry whole


# -- a leader's lock connection ----------------------------------------------------------------
class LockConnection:
    """Takes the lock, then fails its heartbeat with `made`."""

    def __init__(self, made: Made) -> None:
        self.made = made

    async def fetchval(self, query: str, *_: Any) -> Any:
        if "advisory_lock" in query:
            return True
        raise self.made()

    async def close(self) -> None:
        return None


async def test_a_leader_stops_on_a_bug_shaped_client_error_instead_of_contending_for_ever(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def connect(*_: Any) -> LockConnection:
        return LockConnection(BUGS["concurrent use"])

    monkeypatch.setattr(leadership, "connect", connect)
    terms = 0

    async def lead(done: asyncio.Event) -> None:
        nonlocal terms
        terms += 1
        await done.wait()

    contender = Leadership("postgresql://unused", "t", retry_seconds=0.01, heartbeat_seconds=0.02)
    with pytest.raises(asyncpg.InterfaceError, match="another operation is in progress"):
        await asyncio.wait_for(contender.run(asyncio.Event(), lead), 10)
    assert terms == 1
