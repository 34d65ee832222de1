"""The one place where psycopg's and psycopg_pool's errors become anarchon's.

Transient (retried by the scheduler with backoff): the server cannot be reached or went away
(connection refused, reset, ``pg_terminate_backend``, admin shutdown, crash recovery), a pool
that cannot hand out a connection in time, an operation past its timeout, a standby that
refuses writes during a failover, a deadlock or serialisation failure. Anything else, such as
a missing privilege or a table changed by hand, is permanent.
"""

from __future__ import annotations

from typing import Final

from anarchon.errors import BackendError, BackendUnavailable

__all__ = ["first_line", "is_transient", "translate"]

# SQLSTATEs that mean "try again later" although psycopg does not raise OperationalError.
_TRANSIENT_SQLSTATES: Final = frozenset(
    {
        "25006",  # read_only_sql_transaction: connected to a standby during a failover
        "40001",  # serialization_failure
        "40P01",  # deadlock_detected
        "53300",  # too_many_connections
        "55P03",  # lock_not_available
        "57P01",  # admin_shutdown (pg_terminate_backend)
        "57P02",  # crash_shutdown
        "57P03",  # cannot_connect_now (starting up, recovering)
        "57014",  # query_canceled
    }
)


def is_transient(exc: BaseException) -> bool:
    """True if ``exc``, raised by the driver, the pool or the network, may pass if the same
    call is made again later; False for anything else (permanent, or not the driver's)."""
    import psycopg
    from psycopg_pool import PoolTimeout

    if isinstance(exc, PoolTimeout | TimeoutError | OSError):
        return True
    if not isinstance(exc, psycopg.Error):
        return False
    state = exc.sqlstate
    return (
        isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError)
        or state in _TRANSIENT_SQLSTATES
        or (state is not None and state.startswith("08"))  # connection exceptions
    )


def translate(exc: BaseException, where: str) -> BackendError | None:
    """Return the anarchon error for a driver exception, or None if it is not the driver's.

    ``where`` names the server for the message (host, port and database, never a password).
    """
    import psycopg
    from psycopg_pool import PoolClosed, PoolTimeout

    if isinstance(exc, PoolTimeout):
        return BackendUnavailable(f"PostgreSQL {where}: no connection available in time ({exc})")
    if isinstance(exc, PoolClosed):
        return BackendError(f"PostgreSQL {where}: the connection pool is closed ({exc})")
    if isinstance(exc, psycopg.Error):
        kind = BackendUnavailable if is_transient(exc) else BackendError
        return kind(f"PostgreSQL {where}: {first_line(exc)}")
    if isinstance(exc, TimeoutError | OSError):
        return BackendUnavailable(f"PostgreSQL {where}: {exc or type(exc).__name__}")
    return None


def first_line(exc: BaseException) -> str:
    """The first line of an error's message, or its type's name when it has none."""
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]
