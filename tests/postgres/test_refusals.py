"""A start the server refuses for good (a role or database that does not exist, a role that may
not log in, TLS the server does not offer) fails at once with the server's words and what to
change, through the API and the CLI, every option at its default; a server that cannot be
reached is still waited for.

Before: the start waited out timeout_ms (5 s) and raised BackendUnavailable, as for a server
that is down."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from anarchon.backends.postgres._attempts import ConnectAttempts, open_unless_refused
from tests.backends.postgres import DSN, url_of
from tests.refusals import COMMANDS, HOW, refused_cli, refused_start

# timeout_ms's default is 5000: a refusal must end the start well before it.
FAST_S = 2.5
# The CLI test's timeout_ms (see there).
CLI_TIMEOUT_MS = 60_000
_PARAMS = conninfo_to_dict(DSN)
HOST = f"{_PARAMS.get('host') or '127.0.0.1'}:{_PARAMS.get('port') or 5432}"
DBNAME = _PARAMS.get("dbname") or "test"
NO_ROLE = f"anarchon_no_role_{uuid.uuid4().hex[:8]}"
NO_DB = f"anarchon_no_db_{uuid.uuid4().hex[:8]}"
NOLOGIN = f"anarchon_nologin_{uuid.uuid4().hex[:8]}"

CASES = {
    "unknown role": (
        f"postgresql://{NO_ROLE}@{HOST}/{DBNAME}",
        f'FATAL: role "{NO_ROLE}" does not exist; create the role or fix the user name in the DSN',
    ),
    "unknown database": (
        f"postgresql://{HOST}/{NO_DB}",
        f'FATAL: database "{NO_DB}" does not exist; create the database or fix its name in the DSN',
    ),
    "TLS the server has not": (
        f"postgresql://{HOST}/{DBNAME}?sslmode=require",
        "server does not support SSL, but SSL was required; turn TLS on in the server, or an "
        "sslmode in the DSN that does not require it",
    ),
    "role without LOGIN": (
        f"postgresql://{NOLOGIN}@{HOST}/{DBNAME}",
        f'FATAL: role "{NOLOGIN}" is not permitted to log in; give the role LOGIN '
        "(ALTER ROLE ... LOGIN)",
    ),
}


@pytest.fixture(scope="module")
def nologin_role() -> Iterator[None]:
    """The role ``NOLOGIN`` exists and may not log in (dropped afterwards)."""
    with psycopg.connect(DSN, autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {NOLOGIN} NOLOGIN")
        try:
            yield
        finally:
            admin.execute(f"DROP ROLE IF EXISTS {NOLOGIN}")


def _skip_unless_refused(case: str) -> None:
    """The TLS case needs a server without TLS, as the shared one is."""
    if case == "TLS the server has not":
        with psycopg.connect(DSN) as conn:
            row = conn.execute("SHOW ssl").fetchone()
        if row is not None and row[0] == "on":
            pytest.skip("the server offers TLS")


def _where(url: str) -> str:
    dbname = url.rsplit("/", 1)[1].split("?")[0]
    return f"PostgreSQL {HOST}/{dbname} refused the connection: "


@pytest.mark.usefixtures("nologin_role")
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("how", HOW)
async def test_a_refused_start_fails_at_once_with_what_to_change(case: str, how: str) -> None:
    _skip_unless_refused(case)
    url, said = CASES[case]
    error, took = await refused_start(url, how)
    assert str(error) == _where(url) + said
    assert took < FAST_S, f"{took:.2f} s: waited for a connection that cannot come"


@pytest.mark.usefixtures("nologin_role")
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("args", COMMANDS)
def test_the_cli_says_the_refusal_in_one_line(
    case: str, args: tuple[str, ...], tmp_path: Path
) -> None:
    _skip_unless_refused(case)
    url, said = CASES[case]
    # A minute to wait for a connection: a refusal said at once is told from one waited out
    # by far more than a loaded machine adds to the interpreter's start and imports (1.2 s
    # alone, 4.5-8 s with both cores busy). The start's own test keeps the default timeout_ms
    # (test_a_refused_start_fails_at_once_with_what_to_change).
    patient = url_of("public", url, timeout_ms=str(CLI_TIMEOUT_MS))  # public: the default
    out, took = refused_cli(patient, args, tmp_path)
    assert out.stderr.count("\n") == 1, out.stderr
    assert "refused the connection: " in out.stderr and said in out.stderr, out.stderr
    assert took < CLI_TIMEOUT_MS / 1000 / 3, f"{took:.2f} s"


@pytest.mark.parametrize(
    ("message", "change"),
    [
        ('FATAL:  role "x" does not exist', "create the role"),
        ('FATAL:  database "x" does not exist', "create the database"),
        ('FATAL:  password authentication failed for user "x"', "fix the password"),
        ("fe_sendauth: no password supplied", "give the password"),
        ('FATAL:  no pg_hba.conf entry for host "10.0.0.1", user "x"', "pg_hba.conf entry"),
        ('FATAL:  pg_hba.conf rejects connection for host "10.0.0.1"', "pg_hba.conf entry"),
        ('FATAL:  role "x" is not permitted to log in', "LOGIN"),
        ('FATAL:  permission denied for database "x"', "GRANT CONNECT"),
        ('FATAL:  Peer authentication failed for user "x"', "fix the user"),
        # Retried as before: the server is down, starting, full or unreachable.
        ("Connection refused\n\tIs the server running on that host", None),
        ("FATAL:  the database system is starting up", None),
        ("FATAL:  sorry, too many clients already", None),
        ("FATAL:  remaining connection slots are reserved for superusers", None),
        ("FATAL:  terminating connection due to administrator command", None),
        ("timeout expired", None),
    ],
)
def test_which_connection_failures_are_refusals(message: str, change: str | None) -> None:
    from anarchon.backends.postgres._errors import refusal

    exc = psycopg.OperationalError(
        f'connection failed: connection to server at "127.0.0.1", port 5432 failed: {message}'
    )
    found = refusal(exc)
    if change is None:
        assert found is None
    else:
        assert found is not None and change in found, found
        assert found.startswith(" ".join(message.split())), found


async def test_a_cancellation_while_a_refused_opening_ends_is_not_absorbed() -> None:
    """A start cancelled while it gives up the opening of a refused pool, the opening still
    ending (psycopg_pool closing what it had begun), is cancelled. Before, the cancellation was
    absorbed with the opening's outcome and the start went on as refused."""
    attempts = ConnectAttempts()
    ending, release = asyncio.Event(), asyncio.Event()

    class SlowToCancelPool:
        """A pool refused as it opens, whose opening takes a while to end once cancelled."""

        async def open(self, **options: Any) -> None:
            try:
                attempts.refused.set()
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                ending.set()
                await release.wait()
                raise

    call = asyncio.ensure_future(open_unless_refused(cast(Any, SlowToCancelPool()), attempts, 60))
    try:
        await asyncio.wait_for(ending.wait(), 10)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(call, 10)
    finally:
        release.set()
        await asyncio.sleep(0)
