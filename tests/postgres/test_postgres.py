"""PostgreSQL specifics: identifiers, URLs, migrations, pools and connections the caller owns,
notifications, pruning, and the same answers as the reference lease rules."""

from __future__ import annotations

import asyncio
import logging
import os
import random
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from anarchon import (
    BackendError,
    BackendUnavailable,
    InvalidOption,
    LeaseBackend,
    LeaseLost,
    MemoryBackend,
    Overlap,
    RunStatus,
    Trigger,
    backend_from_url,
)
from anarchon.backend import ClaimRequest, ClaimStatus, TakeoverRequest, TakeoverStatus
from anarchon.backends.postgres import PostgresBackend
from anarchon.backends.postgres._queries import Names, Queries
from anarchon.kit.lease import PRUNED_REASON
from anarchon.registry import JobDefinition, read_instances, record_instance
from tests.backends.postgres import DSN, drop_schema, fresh_schema, url_of
from tests.records import instance_record

SLOT = 1_800_000_000_000
Make = Callable[..., PostgresBackend]


def request(slot: int | None = SLOT, job: str = "job", **kw: Any) -> ClaimRequest:
    return ClaimRequest(
        job=job,
        slot=slot,
        run_id=kw.pop("run_id", None) or uuid.uuid4().hex,
        token=kw.pop("token", None) or uuid.uuid4().hex,
        instance=kw.pop("instance", "i1"),
        trigger=kw.pop("trigger", Trigger.SCHEDULE if slot is not None else Trigger.MANUAL),
        lease_ms=kw.pop("lease_ms", 5_000),
        **kw,
    )


async def fetch(query: str, *params: Any) -> list[tuple[Any, ...]]:
    async with await psycopg.AsyncConnection.connect(DSN, autocommit=True) as conn:
        cur = await conn.execute(query, params)
        return await cur.fetchall()


# -- identifiers and URLs ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("option", "value", "rule"),
    [
        ("schema", "Public", "lower-case"),
        ("schema", "my-schema", "lower-case"),
        ("schema", 'x"; DROP TABLE y; --', "lower-case"),
        ("schema", "", "1-63"),
        ("schema", "s" * 64, "1-63"),
        ("schema", "9lives", "not starting with a digit"),
        ("schema", "pg_temp", "reserved"),
        ("schema", None, "1-63"),
        ("table_prefix", "App_", "lower-case"),
        ("table_prefix", "a.b_", "lower-case"),
        ("table_prefix", "p" * 41, "at most 40"),
        ("table_prefix", "1x_", "not starting with a digit"),
    ],
)
def test_bad_schema_and_prefix_are_refused_with_the_rule(
    option: str, value: Any, rule: str
) -> None:
    with pytest.raises(InvalidOption) as caught:
        PostgresBackend(DSN, **{option: value})
    message = str(caught.value)
    assert f"{option}={value!r}" in message and rule in message


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("history_size", 0),
        ("timeout_ms", 10),
        ("max_connections", 0),
        ("notifications", "no"),
        ("prepared_statements", 1),
    ],
)
def test_bad_options_are_refused(option: str, value: Any) -> None:
    with pytest.raises(InvalidOption, match=option):
        PostgresBackend(DSN, **{option: value})


def test_a_sync_pool_is_refused() -> None:
    with pytest.raises(InvalidOption, match="AsyncConnectionPool"):
        PostgresBackend(pool=object())  # type: ignore[arg-type]


KEYWORDS = ("select", "order", "table", "where", "group", "limit", "union", "from", "check")


async def test_reserved_words_are_quoted_identifiers() -> None:
    # A schema named after an SQL keyword is a syntax error anywhere it is not quoted. Pick one
    # no other run is using, so that this test never drops someone else's schema.
    existing = {n for (n,) in await fetch("SELECT nspname FROM pg_namespace")}
    free = [k for k in KEYWORDS if k not in existing]
    assert free, "every keyword schema exists: left over by earlier runs?"
    odd = random.choice(free)
    backend = PostgresBackend(DSN, schema=odd, table_prefix="order_")
    assert f'"{odd}"."order_runs"'.encode() in backend._queries["history"]
    try:
        await backend.start()
        [won] = await backend.claim([request()])
        assert won.status is ClaimStatus.WON
        tables = await fetch(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s ORDER BY 1",
            odd,
        )
        assert [t for (t,) in tables] == [
            "order_jobs",
            "order_pauses",
            "order_pruned",
            "order_requests",
            "order_runs",
            "order_schema_additions",
            "order_schema_version",
        ]
    finally:
        await backend.stop()
        await drop_schema(odd)


def test_from_url_takes_its_options_out_of_the_dsn() -> None:
    backend = backend_from_url(
        "postgresql://u@127.0.0.1:5432/test?schema=s1&table_prefix=p_&sslmode=disable"
        "&application_name=x&notifications=off&history_size=7&timeout_ms=900&max_connections=3"
        "&prepared_statements=false"
    )
    assert isinstance(backend, PostgresBackend)
    assert (backend.schema, backend.table_prefix) == ("s1", "p_")
    assert backend.dsn == "postgresql://u@127.0.0.1:5432/test?sslmode=disable&application_name=x"
    assert backend.history_size == 7 and backend.timeout_ms == 900
    assert backend.max_connections == 3 and not backend.prepared_statements
    assert not backend.notifications and backend.release_poll_ms == 500
    plain = PostgresBackend.from_url("postgres://h/db")
    assert plain.schema == "public" and plain.table_prefix == "anarchon_"
    assert plain.notifications and plain.release_poll_ms is None
    with pytest.raises(InvalidOption, match="history_size='many'"):
        PostgresBackend.from_url("postgresql://h/db?history_size=many")
    with pytest.raises(InvalidOption, match="notifications='maybe'"):
        PostgresBackend.from_url("postgresql://h/db?notifications=maybe")
    with pytest.raises(InvalidOption, match="schema='Bad'"):
        PostgresBackend.from_url("postgresql://h/db?schema=Bad")
    with pytest.raises(InvalidOption, match=r"timeout_ms=5 .*'postgresql://u:\*\*\*@h/db.*100 to"):
        PostgresBackend.from_url("postgresql://u:pw@h/db?timeout_ms=5")
    with pytest.raises(InvalidOption, match="'max_connections' twice"):
        PostgresBackend.from_url("postgresql://h/db?max_connections=2&max_connections=3")
    assert PostgresBackend.from_url("postgresql://h/db?table_prefix=").table_prefix == ""


def test_a_dsn_libpq_cannot_read_is_refused_when_the_backend_is_made() -> None:
    # libpq refused these at the first connection: a raw psycopg.ProgrammingError out of start(),
    # and "cannot reach" with exit code 4 from the CLI.
    with pytest.raises(InvalidOption) as caught:
        backend_from_url("postgresql://u:pw@127.0.0.1:5432/test?schema=s1&sslmod=require")
    assert 'invalid URI query parameter: "sslmod"' in str(caught.value)
    assert "postgresql://u:***@127.0.0.1:5432/test?sslmod=require" in str(caught.value)
    with pytest.raises(InvalidOption) as caught:
        PostgresBackend("host=h password=pw colour=blue")
    assert 'invalid connection option "colour"' in str(caught.value)
    assert "password=***" in str(caught.value) and "pw " not in str(caught.value)
    with pytest.raises(InvalidOption) as caught:
        PostgresBackend("postgresql://h/db?schema=s1")
    assert "schema is the backend's own option" in str(caught.value)
    assert "PostgresBackend.from_url()" in str(caught.value)
    with pytest.raises(InvalidOption, match="not a connection string libpq accepts"):
        PostgresBackend("just words")


SOCKET_DIR = "/var/run/postgresql"


def test_from_url_keeps_an_empty_host_and_the_dsn_as_written() -> None:
    # An empty host: libpq's default socket, or the directory given as host=.
    backend = PostgresBackend.from_url(f"postgresql:///test?host={SOCKET_DIR}&schema=s1")
    assert backend.dsn == f"postgresql:///test?host={SOCKET_DIR}"
    assert conninfo_to_dict(backend.dsn) == {"host": SOCKET_DIR, "dbname": "test"}
    assert repr(backend).startswith(f"PostgresBackend('{SOCKET_DIR}:5432/test'")
    assert PostgresBackend.from_url("postgresql:///test").dsn == "postgresql:///test"
    # libpq's options stay as written: '+' and %20 are not the same to libpq.
    escaped = "postgresql://h/db?options=-c%20search_path%3Dx&application_name=a+b&timeout_ms=900"
    backend = PostgresBackend.from_url(escaped)
    assert backend.dsn == "postgresql://h/db?options=-c%20search_path%3Dx&application_name=a+b"
    assert conninfo_to_dict(backend.dsn)["options"] == "-c search_path=x"
    assert backend.timeout_ms == 900


@pytest.mark.skipif(not Path(SOCKET_DIR).is_dir(), reason=f"no PostgreSQL socket in {SOCKET_DIR}")
async def test_a_backend_connects_through_the_socket_directory_of_its_url(schema: str) -> None:
    backend = backend_from_url(f"postgresql:///test?host={SOCKET_DIR}&schema={schema}")
    await backend.start()
    try:
        [won] = await backend.claim([request()])
        assert won.status is ClaimStatus.WON
    finally:
        await backend.stop()


def test_module_imports_without_the_driver() -> None:
    code = (
        "import sys; sys.modules['psycopg'] = None; sys.modules['psycopg_pool'] = None\n"
        "import anarchon.backends.postgres as m\n"
        "from anarchon import MissingDependency\n"
        "try:\n    m.PostgresBackend()\n"
        "except MissingDependency as e:\n    print('missing:', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "pip install 'anarchon[postgres]'" in out.stdout, out.stderr


# -- migrations --------------------------------------------------------------------------------


async def test_instances_migrating_a_fresh_schema_at_once(make: Make, schema: str) -> None:
    backends = [make() for _ in range(6)]
    await asyncio.gather(*(b.start() for b in backends))
    outcomes = await asyncio.gather(*(b.claim([request()]) for b in backends))
    assert sum(o[0].status is ClaimStatus.WON for o in outcomes) == 1
    versions = await fetch(
        sql.SQL("SELECT version FROM {} ORDER BY 1")
        .format(sql.Identifier(schema, "anarchon_schema_version"))
        .as_string(None)
    )
    assert versions == [(1,), (2,), (3,), (4,)]
    await backends[0].stop()
    await backends[0].start()  # again: nothing to migrate, no error


async def test_instances_creating_the_registry_tables_at_once(make: Make, schema: str) -> None:
    # Instances deployed together write their first records at once: the registry's and the
    # definitions' tables are created by whoever writes first, without a catalog race
    # ("duplicate key value violates unique constraint pg_type_typname_nsp_index").
    backends = [make() for _ in range(6)]
    await asyncio.gather(*(b.start() for b in backends))
    for _ in range(3):  # a race is not certain in one try: three fresh tries
        await drop_registry_tables(schema)
        stores = [b.registry() for b in backends]  # each store creates its tables again
        job = JobDefinition(name="j", expression="* * * * *", zone="UTC")
        await asyncio.gather(
            *(
                record_instance(store, instance_record(f"i{n}", job))
                for n, store in enumerate(stores)
            )
        )
        assert sorted(r.id for r in await read_instances(stores[0])) == [f"i{n}" for n in range(6)]


ROOT = Path(__file__).resolve().parents[2]


async def test_the_docs_and_the_prefix_rule_name_every_table(make: Make, schema: str) -> None:
    # Every table a started backend makes (the migrations' and the registry's, at defaults): the
    # README and docs/backends/postgres.md count them, the docs' table lists them, and a bad
    # table_prefix's error names each (they said "four" and "six" and named three).
    backend = make()
    await backend.start()
    job = JobDefinition(name="j", expression="* * * * *", zone="UTC")
    await record_instance(backend.registry(), instance_record("i0", job))
    rows = await fetch(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", schema
    )
    tables = sorted(name.removeprefix("anarchon_") for (name,) in rows)
    assert len(tables) == 9, tables
    with pytest.raises(InvalidOption) as refused:
        PostgresBackend(DSN, table_prefix="Bad_")
    assert sorted(re.findall(r"<prefix>(\w+)", str(refused.value))) == tables
    assert "nine tables" in str(refused.value)
    page = (ROOT / "docs" / "backends" / "postgres.md").read_text()
    assert sorted(set(re.findall(r"^\| `<prefix>(\w+)` \|", page, re.M))) == tables
    assert "Nine tables in `schema`" in page
    assert "on the nine tables" in page
    assert "history in\nnine tables" in (ROOT / "README.md").read_text()


async def drop_registry_tables(schema: str) -> None:
    async with await psycopg.AsyncConnection.connect(DSN, autocommit=True) as conn:
        for table in ("anarchon_registry", "anarchon_definitions"):
            await conn.execute(
                sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(schema, table))
            )


async def test_a_version_1_schema_is_migrated_and_keeps_its_history(schema: str) -> None:
    q = Queries(Names(schema, "anarchon_"))
    runs = sql.Identifier(schema, "anarchon_runs")
    async with await psycopg.AsyncConnection.connect(DSN, autocommit=True) as conn:
        await conn.execute(q["create_schema"])
        await conn.execute(q["create_version_table"])
        for statement in q.script("migration_1"):
            await conn.execute(statement)
        await conn.execute(q["set_schema_version"], {"version": 1})
        for slot in (SLOT, SLOT + 1000):  # two runs recorded in one millisecond
            await conn.execute(
                sql.SQL(
                    "INSERT INTO {} (job, slot_key, attempt, slot, run_id, token, instance,"
                    " trigger, status, fence, started_at)"
                    " VALUES ('job', %s, 1, %s, %s, 't', 'i', 'schedule', 'succeeded', 1, 5)"
                ).format(runs),
                (str(slot), slot, f"r{slot}"),
            )
    backend = PostgresBackend(DSN, schema=schema, max_connections=2)
    await backend.start()
    try:
        assert [r.slot_ms for r in await backend.history("job")] == [SLOT + 1000, SLOT]
    finally:
        await backend.stop()
    versions = await fetch(
        sql.SQL("SELECT version FROM {} ORDER BY 1")
        .format(sql.Identifier(schema, "anarchon_schema_version"))
        .as_string(None)
    )
    assert versions == [(1,), (2,), (3,), (4,)]


async def test_a_newer_schema_version_is_refused(make: Make, schema: str) -> None:
    await make().start()
    table = sql.Identifier(schema, "anarchon_schema_version")
    await fetch(
        sql.SQL("INSERT INTO {} VALUES (99, 0) RETURNING version").format(table).as_string(None)
    )
    with pytest.raises(BackendError, match="schema version 99, newer than this anarchon"):
        await make().start()


async def test_a_reader_creates_nothing_and_says_what_is_missing(make: Make, schema: str) -> None:
    reader = make()
    with pytest.raises(
        BackendError, match=rf"no anarchon tables {schema}\.anarchon_\* in PostgreSQL"
    ):
        await reader.start_reader()
    assert await fetch("SELECT 1 FROM pg_namespace WHERE nspname = %s", schema) == []
    writer = make()
    await writer.start()
    [won] = await writer.claim([request()])
    await reader.start_reader()
    assert [r.run_id for r in await reader.history("job")] == [won.run.run_id]


async def test_a_reader_leaves_old_tables_as_they_are(schema: str) -> None:
    q = Queries(Names(schema, "anarchon_"))
    async with await psycopg.AsyncConnection.connect(DSN, autocommit=True) as conn:
        await conn.execute(q["create_schema"])
        await conn.execute(q["create_version_table"])
        for statement in q.script("migration_1"):
            await conn.execute(statement)
        await conn.execute(q["set_schema_version"], {"version": 1})
    reader = PostgresBackend(DSN, schema=schema, max_connections=1)
    with pytest.raises(BackendError, match="schema version 1, older than this anarchon reads"):
        await reader.start_reader()
    versions = sql.Identifier(schema, "anarchon_schema_version")
    assert await fetch(sql.SQL("SELECT version FROM {}").format(versions).as_string(None)) == [(1,)]


async def test_unreachable_server_fails_start_quickly() -> None:
    backend = PostgresBackend("postgresql://127.0.0.1:1/test", timeout_ms=1_000)
    with pytest.raises(
        BackendUnavailable, match=r"cannot connect to PostgreSQL 127\.0\.0\.1:1/test"
    ):
        await asyncio.wait_for(backend.start(), 10)
    with pytest.raises(BackendError, match="not started"):
        await backend.history("x")


async def test_an_unreachable_server_is_one_error_not_the_pools_warnings(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """psycopg_pool logs each failed attempt of the backend's pool at WARNING, over two lines;
    the start's one error already gives the reason. They are left out while start() waits; a
    pool of the caller's own still logs its attempts."""
    caplog.set_level(logging.DEBUG)
    backend = PostgresBackend("postgresql://127.0.0.1:1/test", timeout_ms=3_000)
    with pytest.raises(BackendUnavailable, match="Connection refused"):
        await asyncio.wait_for(backend.start(), 20)
    assert [r.getMessage() for r in caplog.records if r.name == "psycopg.pool"] == []
    mine = AsyncConnectionPool(
        "postgresql://127.0.0.1:1/test", min_size=1, open=False, name="anarchon-public.anarchon_"
    )
    with pytest.raises(PoolTimeout):
        await mine.open(wait=True, timeout=3)
    await mine.close()
    said = [r.getMessage() for r in caplog.records if r.name == "psycopg.pool"]
    assert any(m.startswith("error connecting in 'anarchon-public.anarchon_'") for m in said)


def test_anarchon_run_on_an_unreachable_server_says_one_line(tmp_path: Path) -> None:
    """README: "Every failure is one line on stderr"; three multi-line psycopg.pool WARNINGs
    came first."""
    (tmp_path / "app.py").write_text(
        "from anarchon import Scheduler\n"
        "scheduler = Scheduler()\n"
        "scheduler.add('tick', '* * * * *', lambda ctx: None)\n"
    )
    out = subprocess.run(
        [sys.executable, "-m", "anarchon", "run", "app:scheduler"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "ANARCHON_BACKEND": "postgresql://127.0.0.1:1/test"},
        timeout=60,
        check=False,
    )
    assert out.returncode == 4, (out.returncode, out.stderr)
    assert out.stderr.count("\n") == 1 and "psycopg" not in out.stderr, out.stderr
    assert out.stderr.startswith(
        "anarchon: cannot connect to PostgreSQL 127.0.0.1:1/test within timeout_ms=5000: "
    ), out.stderr


# -- what the caller owns -----------------------------------------------------------------------


async def test_a_pool_the_caller_passes_stays_open(schema: str) -> None:
    async with AsyncConnectionPool(DSN, min_size=1, max_size=2, open=False) as pool:
        backend = PostgresBackend(pool=pool, schema=schema)
        await backend.start()
        [won] = await backend.claim([request()])
        assert won.ticket is not None
        await backend.finish(won.ticket, RunStatus.SUCCEEDED, None)
        await backend.stop()
        assert not pool.closed
        async with pool.connection() as conn:
            cur = await conn.execute(
                sql.SQL("SELECT status FROM {}").format(sql.Identifier(schema, "anarchon_runs"))
            )
            assert await cur.fetchall() == [("succeeded",)]


async def test_a_connection_the_caller_passes_stays_open(schema: str) -> None:
    # Not in autocommit mode: the backend must still commit what it does.
    async with await psycopg.AsyncConnection.connect(DSN) as conn:
        backend = PostgresBackend(pool=conn, schema=schema)
        await backend.start()
        outcomes = await asyncio.gather(*(backend.claim([request(SLOT + n)]) for n in range(5)))
        assert all(o[0].status is ClaimStatus.WON for o in outcomes)
        await backend.stop()
        assert not conn.closed
        again = PostgresBackend(pool=conn, schema=schema)
        await again.start()
    rows = await fetch(
        sql.SQL("SELECT count(*) FROM {}")
        .format(sql.Identifier(schema, "anarchon_runs"))
        .as_string(None)
    )
    assert rows == [(5,)]
    # The caller closed it: the backend says so instead of reconnecting behind their back.
    with pytest.raises(BackendUnavailable, match="closed"):
        await again.history("job")
    await again.stop()


# -- notifications -------------------------------------------------------------------------------


async def test_release_and_finish_notify_other_instances(make: Make) -> None:
    runner, backup = make(), make()
    await runner.start()
    await backup.start()
    heard: list[tuple[str, str, bool]] = []
    await backup.subscribe(lambda job, key, released: heard.append((job, key, released)))
    [a, b] = await runner.claim([request(SLOT), request(SLOT + 1000)])
    assert a.ticket is not None and b.ticket is not None
    await runner.release(a.ticket, "handed over")
    await runner.finish(b.ticket, RunStatus.SUCCEEDED, None)
    for _ in range(100):
        if len(heard) >= 2:
            break
        await asyncio.sleep(0.02)
    assert heard == [("job", str(SLOT), True), ("job", str(SLOT + 1000), False)]


async def test_without_notifications_backups_poll(make: Make) -> None:
    backend = make(notifications=False)
    assert backend.release_poll_ms == 500
    await backend.start()
    await backend.subscribe(lambda job, key, released: None)
    assert backend._listener is None


# -- pruning --------------------------------------------------------------------------------------


async def test_history_is_capped_by_count(make: Make) -> None:
    backend = make(history_size=5)
    await backend.start()
    for n in range(12):
        [won] = await backend.claim([request(SLOT + n * 1000)])
        assert won.ticket is not None
        await backend.finish(won.ticket, RunStatus.SUCCEEDED, None)
    history = await backend.history("job", limit=100)
    assert [r.slot_ms for r in history] == [SLOT + n * 1000 for n in range(11, 6, -1)]
    [again] = await backend.claim([request(SLOT + 3000)])
    assert again.status is ClaimStatus.LOST, "a pruned slot was claimed a second time"
    assert again.run.reason == PRUNED_REASON


async def test_pruning_keeps_running_attempts(make: Make) -> None:
    backend = make(history_size=1)
    await backend.start()
    [old] = await backend.claim([request(SLOT)])  # stays running
    for n in range(1, 4):
        [won] = await backend.claim([request(SLOT + n * 1000)])
        assert won.ticket is not None
        await backend.finish(won.ticket, RunStatus.SUCCEEDED, None)
    history = await backend.history("job", limit=100)
    assert {r.slot_ms: r.status for r in history} == {
        SLOT + 3000: RunStatus.SUCCEEDED,
        SLOT: RunStatus.RUNNING,
    }
    assert old.ticket is not None
    await backend.renew(old.ticket)


# -- the same answers as the reference rules ---------------------------------------------------


def _scenario() -> list[tuple[str, Any]]:
    """Claims in batches (overlap inside a batch, one slot twice, skips, manual runs) and
    takeovers, to replay on two backends with the same run ids and tokens."""
    r = request
    first = r(SLOT, overlap=Overlap.SKIP)
    return [
        ("claim", [first, r(SLOT + 1000, overlap=Overlap.SKIP), r(SLOT + 2000)]),
        ("claim", [first, r(SLOT, instance="i2"), r(SLOT + 1000, instance="i2")]),
        ("claim", [r(SLOT + 3000, skip_reason="too late: test"), r(SLOT + 3000, token="t9")]),
        ("claim", [r(None, overlap=Overlap.SKIP), r(None, run_id="m2", overlap=Overlap.ALLOW)]),
        ("claim", [r(SLOT + 4000, job="other", overlap=Overlap.SKIP), r(SLOT + 5000, job="other")]),
        ("take_over", ("job", str(SLOT), 3)),
        ("release", 0),
        ("take_over", ("job", str(SLOT), 3)),
        ("take_over", ("job", str(SLOT), 3)),
        ("take_over", ("job", str(SLOT + 1000), 3)),
        ("release", 1),
        ("take_over", ("job", str(SLOT + 2000), 1)),
        ("claim", [r(SLOT + 6000, overlap=Overlap.SKIP, job="other")]),
        ("claim", [r(SLOT + 7000, overlap=Overlap.SKIP)]),
    ]


async def _replay(backend: LeaseBackend, scenario: list[tuple[str, Any]]) -> list[Any]:
    seen: list[Any] = []
    tickets = []
    for step, arg in scenario:
        if step == "claim":
            for o in await backend.claim(arg):
                if o.ticket is not None:
                    tickets.append(o.ticket)
                seen.append(
                    (o.status, o.run.run_id, o.run.attempt, o.run.status, _any(o.run.reason))
                )
        elif step == "release":
            try:
                await backend.release(tickets[arg], "handed over")
                seen.append("released")
            except LeaseLost as exc:
                seen.append(str(exc))
        else:
            job, key, attempts = arg
            out = await backend.take_over(
                TakeoverRequest(
                    job=job,
                    slot_key=key,
                    run_id=f"t-{len(seen)}",
                    token=f"tok-{len(seen)}",
                    instance="backup",
                    lease_ms=5_000,
                    max_attempts=attempts,
                )
            )
            run = out.run
            seen.append((out.status, run and (run.run_id, run.attempt, run.status, run.error)))
            if out.ticket is not None:
                tickets.append(out.ticket)
    for job in ("job", "other"):
        runs = await backend.history(job)
        # Fences differ between backends (they start at each one's clock); their order may not.
        rank = {f: n for n, f in enumerate(sorted({r.fence for r in runs if r.fence}))}
        seen.append(
            sorted(
                (r.run_id, r.attempt, r.status, _any(r.reason), r.error, rank.get(r.fence or 0))
                for r in runs
            )
        )
    return seen


def _any(reason: str | None) -> str | None:
    """Overlap reasons name one live holder, and with several any of them will do."""
    if reason and reason.startswith("overlap: run ") and reason.endswith(" still holds its lease"):
        return "overlap: run <a live holder> still holds its lease"
    return reason


async def test_same_answers_as_the_reference_rules(make: Make) -> None:
    scenario = _scenario()
    reference = MemoryBackend()
    await reference.start()
    expected = await _replay(reference, scenario)
    backend = make()
    await backend.start()
    got = await _replay(backend, scenario)
    for step, (mine, theirs) in enumerate(zip(got, expected, strict=True)):
        assert mine == theirs, f"step {step}"
    flat = [s[0] for s in got if isinstance(s, tuple)]
    assert {ClaimStatus.SKIPPED, ClaimStatus.LOST, TakeoverStatus.TAKEN} <= set(flat)
    assert TakeoverStatus.EXHAUSTED in flat and TakeoverStatus.HELD in flat


async def test_fences_are_unique_under_concurrent_claims_and_takeovers(make: Make) -> None:
    backends = [make() for _ in range(4)]
    for b in backends:
        await b.start()
    reqs = [
        [request(SLOT + n * 1000, instance=f"i{k}", overlap=Overlap.ALLOW) for n in range(20)]
        for k in range(4)
    ]
    outcomes = await asyncio.gather(*(b.claim(r) for b, r in zip(backends, reqs, strict=True)))
    won = [o for batch in outcomes for o in batch if o.status is ClaimStatus.WON]
    assert len(won) == 20
    fences = sorted(o.ticket.fence for o in won if o.ticket and o.ticket.fence)
    assert len(set(fences)) == 20


async def test_overlap_reason_names_the_slot_like_python(make: Make) -> None:
    backend = make()
    await backend.start()
    odd_slot = SLOT + 123  # not on a whole second: the reason shows microseconds
    [held] = await backend.claim([request(odd_slot)])
    [skip] = await backend.claim([request(SLOT + 5000, overlap=Overlap.SKIP)])
    assert skip.status is ClaimStatus.SKIPPED
    assert held.run.slot is not None
    assert skip.run.reason == (
        f"overlap: run {held.run.run_id} (slot {held.run.slot.isoformat()}) still holds its lease"
    )
    assert "2027-01-15T08:00:00.123000+00:00" in skip.run.reason


async def test_a_big_batch_is_decided_at_once(make: Make) -> None:
    first, second = make(), make()
    await first.start()
    await second.start()
    reqs = [request(SLOT, job=f"job{n}") for n in range(2_000)]
    began = time.perf_counter()
    outcomes = await first.claim(reqs)
    took = time.perf_counter() - began
    assert [o.status for o in outcomes] == [ClaimStatus.WON] * 2_000
    again = await second.claim([request(SLOT, job=f"job{n}", instance="i2") for n in range(2_000)])
    assert {o.status for o in again} == {ClaimStatus.LOST}
    assert [o.run.run_id for o in again] == [r.run_id for r in reqs]
    print(f"\npostgres: 2000 claims in one batch took {took * 1000:.0f} ms")


async def test_a_large_batch_is_planned_for_its_size(schema: str) -> None:
    # As if PostgreSQL had switched the prepared claim to its generic plan (plan_cache_mode =
    # auto may, after five executions): that plan counts on 10 rows from unnest() and took over
    # 10 s for 10 000 requests. The claim's transaction plans a large batch for its size.
    async with await psycopg.AsyncConnection.connect(DSN, autocommit=True) as conn:
        await conn.execute("SET plan_cache_mode = force_generic_plan")
        backend = PostgresBackend(pool=conn, schema=schema)
        await backend.start()
        for n in range(8):  # prepared after five executions; the rows give the planner data
            batch = [request(SLOT + n * 1000, job=f"job{j}") for j in range(2_000)]
            assert {o.status for o in await backend.claim(batch)} == {ClaimStatus.WON}
        reqs = [request(SLOT - 1000, job=f"job{j}") for j in range(10_000)]
        began = time.perf_counter()
        outcomes = await backend.claim(reqs)
        took = time.perf_counter() - began
        await backend.stop()
    assert [o.status for o in outcomes] == [ClaimStatus.WON] * 10_000
    print(f"\npostgres: 10 000 claims after 8 batches of 2 000 took {took * 1000:.0f} ms")
    assert took < 5.0, f"a batch of 10 000 claims took {took:.1f} s: planned as a small one?"


async def test_schema_is_dropped_by_the_harness() -> None:
    name = fresh_schema()
    backend = backend_from_url(url_of(name))
    await backend.start()
    await backend.stop()
    assert await fetch("SELECT 1 FROM pg_namespace WHERE nspname = %s", name) == [(1,)]
    await drop_schema(name)
    assert await fetch("SELECT 1 FROM pg_namespace WHERE nspname = %s", name) == []


async def test_mixed_concurrent_traffic_has_no_deadlock_and_one_winner(make: Make) -> None:
    """Four instances claim the same jobs in shuffled batches while winners finish, release
    and backups take over: no deadlock (PostgreSQL would abort one side with 40P01), one
    winner per slot and per takeover, and fences never repeat within a job."""
    backends = [make(max_connections=4) for _ in range(4)]
    for b in backends:
        await b.start()
    jobs = [f"job{n}" for n in range(60)]
    fences: dict[str, list[int]] = {job: [] for job in jobs}

    async def instance(k: int, slot: int) -> tuple[int, list[Any]]:
        order = random.Random(k * 7919 + slot).sample(jobs, len(jobs))
        outcomes = await backends[k].claim(
            [request(slot, job=j, instance=f"i{k}", overlap=Overlap.SKIP) for j in order]
        )
        won = [o.ticket for o in outcomes if o.ticket is not None]
        for ticket in won:
            if ticket.fence is not None:
                fences[ticket.job].append(ticket.fence)
        done = [backends[k].finish(t, RunStatus.SUCCEEDED, None) for t in won[::2]]
        gone = [backends[k].release(t, "handed over") for t in won[1::2]]
        await asyncio.gather(*done, *gone)
        return len(won), won[1::2]

    async def backup(k: int, released: list[Any]) -> list[TakeoverStatus]:
        outs = await asyncio.gather(
            *(
                backends[k].take_over(
                    TakeoverRequest(
                        job=t.job,
                        slot_key=t.slot_key,
                        run_id=uuid.uuid4().hex,
                        token=uuid.uuid4().hex,
                        instance=f"b{k}",
                        lease_ms=5_000,
                        max_attempts=3,
                    )
                )
                for t in released
            )
        )
        taken = [o.ticket for o in outs if o.ticket is not None]
        for ticket in taken:
            if ticket.fence is not None:
                fences[ticket.job].append(ticket.fence)
        await asyncio.gather(*(backends[k].finish(t, RunStatus.SUCCEEDED, None) for t in taken))
        return [o.status for o in outs]

    for round_ in range(3):
        slot = SLOT + round_ * 60_000
        results = await asyncio.gather(*(instance(k, slot) for k in range(4)))
        assert sum(n for n, _ in results) == len(jobs), "one winner per slot"
        everyone = [t for _, released in results for t in released]
        statuses = await asyncio.gather(*(backup(k, everyone) for k in range(4)))
        taken = [s for per in statuses for s in per if s is TakeoverStatus.TAKEN]
        assert len(taken) == len(everyone), "one backup per released run"
    for job, seen in fences.items():
        assert len(seen) == len(set(seen)), f"{job}: a fence was given twice: {seen}"


async def test_a_failed_claim_transaction_leaves_the_connection_clean(
    make: Make, schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    backend = make(max_connections=1)  # one connection: the next call reuses it
    await backend.start()
    async with await psycopg.AsyncConnection.connect(DSN, autocommit=True) as conn:
        table = sql.Identifier(schema, "anarchon_pruned")
        await conn.execute(sql.SQL("ALTER TABLE {} RENAME TO gone").format(table))
    with pytest.raises(BackendError, match="does not exist") as caught:
        await backend.claim([request()])
    assert not isinstance(caught.value, BackendUnavailable), "a missing table is permanent"
    assert await backend.history("job") == []
    assert "rolling back" not in caplog.text


@pytest.mark.parametrize("prepared", [True, False])
async def test_rows_carry_the_column_names_of_their_own_statement(
    make: Make, schema: str, prepared: bool
) -> None:
    # Column names are read once per statement (_statements._NamedRows): a statement's rows
    # never take another statement's names, and a result with another number of columns (a
    # table that gained one) is named afresh.
    backend = make(max_connections=1, prepared_statements=prepared)
    await backend.start()
    db = backend._db
    first = b"SELECT 1 AS one, 2 AS two WHERE %(keep)s::boolean"
    second = b"SELECT 3 AS three, 4 AS four WHERE %(keep)s::boolean"
    assert await db.read(first, {"keep": False}) == []
    for _ in range(3):
        assert await db.read(first, {"keep": True}) == [{"one": 1, "two": 2}]
        assert await db.read(second, {"keep": True}) == [{"three": 3, "four": 4}]
    table = sql.Identifier(schema, "widening")
    async with await psycopg.AsyncConnection.connect(DSN, autocommit=True) as conn:
        await conn.execute(sql.SQL("CREATE TABLE {} (a int)").format(table))
        await conn.execute(sql.SQL("INSERT INTO {} VALUES (1)").format(table))
    wide = sql.SQL("SELECT * FROM {}").format(table).as_bytes(None)
    assert await db.read(wide) == [{"a": 1}]
    async with await psycopg.AsyncConnection.connect(DSN, autocommit=True) as conn:
        await conn.execute(sql.SQL("ALTER TABLE {} ADD COLUMN b int DEFAULT 2").format(table))
    if prepared:  # new sessions: the server refuses a prepared plan whose columns changed
        await backend.stop()
        await backend.start()
    assert await db.read(wide) == [{"a": 1, "b": 2}]


def test_channel_and_identifier_lengths_fit_postgres() -> None:
    short = Names("app", "anarchon_")
    assert short.channel == "app.anarchon_changes"
    longest = Names("s" * 63, "p" * 40)
    assert len(longest.channel) <= 63 and longest.channel.startswith("anarchon_changes_")
    assert longest.channel != Names("s" * 63, "p" * 39 + "q").channel
    for ident in longest.identifiers().values():
        if not isinstance(ident, sql.Identifier):
            continue  # the clock expression, the claim lock's key prefix
        rendered = ident.as_string(None)
        assert all(len(part.strip('"')) <= 63 for part in rendered.split(".")), rendered


def test_statements_are_sent_with_positional_parameters() -> None:
    from anarchon.backends.postgres._queries import positional

    text, names = positional(b"SELECT %(a)s::int, %(b)s, %(a)s, 100 %% 7, '%%'")
    assert text == b"SELECT $1::int, $2, $1, 100 % 7, '%'"
    assert names == ("a", "b")
    assert positional(b"SELECT 1") == (b"SELECT 1", ())


async def test_an_idle_connection_is_trusted_until_the_server_ends_it(
    make: Callable[..., PostgresBackend],
) -> None:
    from anarchon.backends.postgres import _connection

    backend = make(max_connections=1)
    await backend.start()
    await backend.server_time_ms()
    pool = backend._db._pool
    assert pool is not None
    async with pool.connection() as conn:
        pid = conn.info.backend_pid
        assert not _connection._readable(conn)  # quiet: used without a round trip
    async with await psycopg.AsyncConnection.connect(DSN, autocommit=True) as admin:
        await admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
    async with pool.connection() as conn:
        for _ in range(100):  # the server's goodbye arrives within milliseconds
            if _connection._readable(conn):
                break
            await asyncio.sleep(0.01)
        assert _connection._readable(conn)
    await asyncio.sleep(_connection.IDLE_CHECK_S + 0.1)
    # The idle, ended connection is found out before use and replaced: the call succeeds.
    assert await backend.server_time_ms() is not None
