"""The PostgreSQL backend's options: each checked once, and read from a URL's query string.

A bad value is refused when the backend is built, with the value and the rule. Schema and
table prefix must be plain lower-case identifiers: they become quoted SQL identifiers, and
every value of a statement is a query parameter.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Final

from anarchon.errors import InvalidOption, MissingDependency
from anarchon.kit import HISTORY_SIZE, Bound, check_bool, check_int, check_pattern, redact_url
from anarchon.kit.urls import Converter, as_given, bool_option, int_option, ms_option
from anarchon.kit.urls import split_url as split_options

if TYPE_CHECKING:
    from psycopg import AsyncConnection
    from psycopg_pool import AsyncConnectionPool

__all__ = [
    "DEFAULT_DSN",
    "DEFAULT_PREFIX",
    "DEFAULT_SCHEMA",
    "URL_OPTIONS",
    "Options",
    "check_dsn",
    "check_options",
    "check_schema",
    "check_table_prefix",
    "split_url",
]

OWNER: Final = "PostgresBackend"
DEFAULT_DSN: Final = "postgresql://localhost/postgres"
DEFAULT_SCHEMA: Final = "public"
DEFAULT_PREFIX: Final = "anarchon_"
TIMEOUT: Final = Bound(100, 3_600_000, ms=True)
MAX_CONNECTIONS: Final = Bound(1, 1_000)

# PostgreSQL truncates identifiers at 63 bytes; the longest name built from the prefix is
# "<prefix>runs_status_check" (17 more characters), so 40 for the prefix leaves room (and
# PostgreSQL named migration 1's status check exactly that, untruncated).
_SCHEMA_RULE: Final = re.compile(r"[a-z_][a-z0-9_]{0,62}")
_PREFIX_RULE: Final = re.compile(r"([a-z_][a-z0-9_]{0,39})?")


@dataclass(frozen=True, slots=True, kw_only=True)
class Options:
    """Every option of a :class:`~anarchon.backends.postgres.PostgresBackend`, checked."""

    dsn: str | None
    """The connection string the backend opens its own pool on; None with a given pool."""
    pool: AsyncConnectionPool[Any] | AsyncConnection[Any] | None
    """The caller's pool or connection (never closed by the backend), or None."""
    schema: str
    table_prefix: str
    history_size: int
    notifications: bool
    timeout_ms: int
    max_connections: int
    prepared_statements: bool

    def arguments(self) -> dict[str, Any]:
        """The options as :class:`~anarchon.backends.postgres.PostgresBackend`'s arguments
        (the same names)."""
        return {field.name: getattr(self, field.name) for field in fields(self)}

    @property
    def prepare(self) -> bool | None:
        """psycopg's ``prepare`` argument: None prepares what runs often; False never."""
        return None if self.prepared_statements else False

    @property
    def prepare_at_once(self) -> bool:
        """psycopg's ``prepare`` argument for the statement of a call (a claim, a result, a
        read): prepared at its first run on a connection, not its sixth. Unprepared, the claim
        statement took 3.2 ms to plan and run against 0.9 ms, and a pool of several connections
        runs it on each only now and then. (A pool made with ``prepare_threshold=None``
        prepares nothing: that setting wins.)"""
        return self.prepared_statements


def _missing(exc: ImportError) -> MissingDependency:
    """Why psycopg or psycopg_pool cannot be imported: not installed, or (psycopg installed)
    its own reason, such as no libpq found, in its words."""
    from importlib.util import find_spec

    install = "pip install 'anarchon[postgres]'"
    if exc.name in ("psycopg", "psycopg_pool") or find_spec("psycopg") is None:
        return MissingDependency(f"PostgresBackend needs psycopg 3 and psycopg_pool: {install}")
    why = "; ".join(line.strip(" -") for line in str(exc).splitlines() if line.strip(" -"))
    return MissingDependency(
        f"PostgresBackend cannot import psycopg, which is installed: {why} ({install} "
        "installs psycopg's binary package, which carries its own libpq)"
    )


def check_options(
    dsn: object,
    pool: object,
    schema: object,
    table_prefix: object,
    *,
    history_size: object,
    notifications: object,
    timeout_ms: object,
    max_connections: object,
    prepared_statements: object,
) -> Options:
    """Return the options if every one holds to its rule; else raise
    :class:`~anarchon.errors.InvalidOption` naming the first that does not
    (:class:`~anarchon.errors.MissingDependency` without the driver)."""
    try:
        import psycopg
        from psycopg_pool import AsyncConnectionPool
    except ImportError as exc:
        raise _missing(exc) from exc

    if pool is not None and not isinstance(pool, AsyncConnectionPool | psycopg.AsyncConnection):
        raise InvalidOption(
            f"pool={pool!r} must be a psycopg_pool.AsyncConnectionPool or a "
            "psycopg.AsyncConnection (the backend is async; sync pools cannot be used)"
        )
    if pool is None and (not isinstance(dsn, str) or not dsn.strip()):
        raise InvalidOption(f"dsn={dsn!r} must be a PostgreSQL connection string or URL")
    if pool is None:
        check_dsn(str(dsn))
    return Options(
        dsn=dsn if pool is None and isinstance(dsn, str) else None,
        pool=pool,
        notifications=check_bool("notifications", notifications, OWNER),
        prepared_statements=check_bool("prepared_statements", prepared_statements, OWNER),
        schema=check_schema(schema),
        table_prefix=check_table_prefix(table_prefix),
        history_size=check_int("history_size", history_size, HISTORY_SIZE, OWNER),
        timeout_ms=check_int("timeout_ms", timeout_ms, TIMEOUT, OWNER),
        max_connections=check_int("max_connections", max_connections, MAX_CONNECTIONS, OWNER),
    )


def check_dsn(dsn: str) -> None:
    """Refuse a DSN libpq cannot read (an option it does not know, a malformed string) when
    the backend is made, not at its first connection."""
    from psycopg import ProgrammingError
    from psycopg.conninfo import conninfo_to_dict

    try:
        conninfo_to_dict(dsn)
    except ProgrammingError as exc:
        why = str(exc).strip()
        ours = [name for name in URL_OPTIONS if f'"{name}"' in why]
        hint = (
            f"; {ours[0]} is the backend's own option: give the URL to "
            f"PostgresBackend.from_url() or pass {ours[0]}= as an argument"
            if ours
            else ""
        )
        raise InvalidOption(
            f"dsn={redact_url(dsn)!r} is not a connection string libpq accepts: {why}{hint}"
        ) from None


def check_schema(schema: object) -> str:
    """Return ``schema`` if it is a plain lower-case identifier PostgreSQL will not fold."""
    schema = check_pattern(
        "schema",
        schema,
        _SCHEMA_RULE,
        "must be 1-63 characters of lower-case letters, digits and '_', not starting with a "
        "digit (it is used as a quoted SQL identifier)",
    )
    if schema.startswith("pg_"):
        raise InvalidOption(f"schema={schema!r} may not start with 'pg_' (reserved by PostgreSQL)")
    return schema


def check_table_prefix(prefix: object) -> str:
    """Return ``prefix`` if the table and index names built from it are valid identifiers."""
    return check_pattern(
        "table_prefix",
        prefix,
        _PREFIX_RULE,
        "must be at most 40 characters of lower-case letters, digits and '_', not starting "
        "with a digit (it begins the names of the nine tables: <prefix>runs, <prefix>jobs, "
        "<prefix>pruned, <prefix>pauses, <prefix>requests, <prefix>registry, "
        "<prefix>definitions, <prefix>schema_version, <prefix>schema_additions)",
    )


# The query parameters of a URL that are the backend's (the others are libpq's).
URL_OPTIONS: Final[dict[str, Converter]] = {
    "schema": as_given,
    "table_prefix": as_given,
    "notifications": bool_option,
    "prepared_statements": bool_option,
    "history_size": int_option(HISTORY_SIZE),
    "timeout_ms": ms_option(TIMEOUT),
    "max_connections": int_option(MAX_CONNECTIONS),
}


def split_url(url: str) -> tuple[str, dict[str, Any]]:
    """Split ``postgresql://...?schema=s&sslmode=require`` into the DSN for libpq and the
    backend's own options (:data:`URL_OPTIONS`), converted by
    :func:`anarchon.kit.urls.split_url`.

    Everything else stays in the DSN exactly as written, escapes included; so does an empty
    host (``postgresql:///db?host=/run/postgresql``: the socket directory).
    """
    split = split_options(url, URL_OPTIONS, pass_on=True, backend="PostgreSQL")
    return split.url, split.options
