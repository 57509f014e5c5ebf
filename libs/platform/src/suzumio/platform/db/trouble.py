"""Postgres in trouble: failures that say nothing about the work that met them — the server
gone, restarting or short of resources, the connection refused, cut or lost, a transaction
that lost a race. What failed this way may pass when tried again (on another connection); a
bug of ours would fail again, and must not hide behind retries (a 503, an event never parked).

asyncpg's client-side errors are mostly bugs of ours: its `InterfaceError` is a connection
used by two tasks at once ("another operation is in progress"), one used after its release to
the pool, a closed pool, a statement given the wrong number of arguments; its
`InternalClientError` a fault in its protocol code. They count as trouble only in the shapes a
lost connection takes, which `is_postgres_trouble` tells: `POSTGRES_SUSPECTS` lists them for
`except` clauses.
"""

from __future__ import annotations

from asyncpg import exceptions as pg

# Trouble by their type alone. Not `PostgresConnectionError` whole: its
# `ProtocolViolationError` (08P01) is the server saying the client broke the protocol.
POSTGRES_TROUBLE: tuple[type[Exception], ...] = (
    pg.ConnectionDoesNotExistError,  # "connection was closed in the middle of operation"
    pg.ConnectionFailureError,
    pg.ClientCannotConnectError,
    pg.ConnectionRejectionError,
    pg.AdminShutdownError,  # pg_terminate_backend, a fast shutdown
    pg.CrashShutdownError,
    pg.CannotConnectNowError,  # starting up, shutting down, recovering
    pg.DatabaseDroppedError,
    pg.IdleSessionTimeoutError,
    pg.InsufficientResourcesError,  # class 53: disk full, out of memory, too many connections
    pg.PostgresSystemError,  # class 58: an I/O error
    pg.ReadOnlySQLTransactionError,  # 25006: a primary turned read-only by a failover
    # Lost to a concurrent transaction: the same work passes when it runs again.
    pg.SerializationError,
    pg.DeadlockDetectedError,
    # A type changed under a cached statement (a migration, a projection rebuilt): asyncpg
    # reloaded its caches as it raised this, and the same statement passes again.
    pg.OutdatedSchemaCacheError,
    ConnectionError,  # refused or reset: how asyncpg's connecting fails
)

POSTGRES_SUSPECTS: tuple[type[Exception], ...] = (pg.InterfaceError, pg.InternalClientError)


def is_postgres_trouble(exc: BaseException) -> bool:
    """Whether `exc` is Postgres in trouble rather than a bug of the code that met it."""
    if isinstance(exc, POSTGRES_TROUBLE):
        return True
    if type(exc) is pg.InterfaceError:  # not its subclasses: configuration, features
        # A connection the server ended (pg_terminate_backend, a restart) while it lay idle
        # is found closed by the next statement on it, and a transaction's rollback after a
        # statement the cut failed finds it so too. A connection our own code closed and
        # then used reads the same, and asyncpg does not tell them apart: our code closes a
        # connection only when done with it (pools at shutdown, single connections in a
        # `finally`), while every long-held connection meets the server's cut on each
        # Postgres restart (the projector's, the leaders').
        return "connection is closed" in str(exc)
    if type(exc) is pg.InternalClientError:  # not its subclasses (ProtocolError, ...)
        # A connection the server ended while idle can fail its next statement so ("cannot
        # switch to state 11; another operation (2) is in progress") before asyncpg sees
        # it closed: the server's last message put the protocol out of step. A connection
        # used by two tasks at once is refused earlier, as an InterfaceError.
        return str(exc).startswith("cannot switch to state")
    return False
