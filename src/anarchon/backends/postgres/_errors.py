"""The one place where psycopg's and psycopg_pool's errors become anarchon's.

Transient (retried by the scheduler with backoff): the server cannot be reached or went away
(connection refused, reset, ``pg_terminate_backend``, admin shutdown, crash recovery), a pool
that cannot hand out a connection in time, an operation past its timeout, a standby that
refuses writes during a failover, a deadlock or serialisation failure. Anything else, such as
a missing privilege or a table changed by hand, is permanent.

A connection the server refuses for a reason no retry fixes (a role or database that does not
exist, a password refused, ``pg_hba.conf``, a role that may not log in, TLS the DSN asks for and
the server has not, a client certificate missing or a CA file not found) is named by
:func:`refusal`: a start that meets one fails at once instead of waiting out ``timeout_ms``.
"""

from __future__ import annotations

from typing import Final

from anarchon.errors import BackendError, BackendUnavailable
from anarchon.kit.calls import first_line

__all__ = ["NOT_READ_COMMITTED", "first_line", "is_transient", "refusal", "translate"]

# The claim function's refusal to run outside READ COMMITTED (queries.sql, claim_function).
NOT_READ_COMMITTED: Final = "AN001"

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


# Words of the server's (or libpq's) refusal of a connection that no retry fixes, each with what
# to change. The server's messages are in English unless its lc_messages says otherwise: one in
# another language is not recognised and is retried until timeout_ms, as any failed attempt.
_REFUSALS: Final = (
    ('role "', "does not exist", "create the role or fix the user name in the DSN"),
    ('database "', "does not exist", "create the database or fix its name in the DSN"),
    ("password authentication failed", "", "fix the password (DSN, PGPASSWORD or ~/.pgpass)"),
    ("no password supplied", "", "give the password (DSN, PGPASSWORD or ~/.pgpass)"),
    ("pg_hba.conf", "", "add a pg_hba.conf entry for this host, user and database, or fix the DSN"),
    ("is not permitted to log in", "", "give the role LOGIN (ALTER ROLE ... LOGIN)"),
    ("permission denied for database", "", "GRANT CONNECT ON DATABASE to the role"),
    ("authentication failed for user", "", "fix the user or the credentials in the DSN"),
    (
        "requires a valid client certificate",
        "",
        "give sslcert and sslkey in the DSN: a client certificate the server's CA signed",
    ),
    (
        'root certificate file "',
        "does not exist",
        "give sslrootcert in the DSN: the CA that signed the server's certificate",
    ),
    (
        "server does not support SSL",
        "",
        "turn TLS on in the server, or an sslmode in the DSN that does not require it",
    ),
)


def refusal(exc: BaseException) -> str | None:
    """For a connection attempt the server refused for good (see :data:`_REFUSALS`): the
    server's words and what to change; None for anything else (retried as before: a server
    down, starting up or out of connection slots)."""
    import psycopg

    if not isinstance(exc, psycopg.OperationalError) or exc.sqlstate is not None:
        return None
    for line in str(exc).splitlines():
        for first, then, change in _REFUSALS:
            at = line.find(first)
            if at >= 0 and then in line[at:]:
                return f"{_server_words(line)}; {change}"
    return None


def _server_words(line: str) -> str:
    """The refusal in libpq's line ``connection failed: connection to server at ... failed:
    FATAL:  ...``: from ``FATAL:`` on (else after the last ``failed:``), spaces made single."""
    at = line.find("FATAL:")
    if at < 0:
        after = line.rfind("failed: ")
        at = after + len("failed: ") if after >= 0 else 0
    return " ".join(line[at:].split())


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
