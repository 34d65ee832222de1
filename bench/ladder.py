"""The claim rate's alternated rounds (section 3) and its record ladder: what each part of a
claim's storage work costs, step by step from the raw primitive up to ``Backend.claim``.

The three processes of the claim rate (:mod:`bench.claim_rate`) run ``rounds`` short rounds of
every step, the steps' order reversed every other round (primitive, ..., claim; claim, ...,
primitive; ...), each step ``seconds`` long and all three on the same keys. A round's figures
are the three processes' calls per second; each step's rate is the mean over the rounds (its
calls in all rounds over their time), and its share of the primitive that rate over the
primitive's (see :func:`summary`); section 3's headline (claim / primitive, the target) is
read from the same rounds. The rounds are bimodal: whether the processes walk the keys in
lockstep (each key waits for the first writer's commit) or one runs ahead (the others find its
committed keys) changes a round's rate by up to half, so one long loop per step measures that
chance (and the moment it ran at) rather than the step: over eleven PostgreSQL runs, one 3 s
loop per step gave claim / primitive anywhere from 21 to 87 %, the rounds 31-44 %. ``lead``:
the share of a round's keys the process that won most of them won (1/3: the three raced for
every key; 1: one ran ahead), the median over the rounds.

=============  ===========================================================================
step           one call (for key or slot k; PostgreSQL, psycopg 3, autocommit)
=============  ===========================================================================
primitive      :mod:`bench.primitives`: ``INSERT INTO floor.claims VALUES (k) ON CONFLICT
               DO NOTHING`` into a one-column table
record_pk      the run record a won claim writes (every column of the backend's runs table,
               its defaults and identity), into a copy of the runs table with only its
               primary key: ``INSERT ... ON CONFLICT DO NOTHING RETURNING`` the record, and a
               loser then reads the winner's record (as the backend's ``current_attempt``
               looks it up, by the primary key); positional, binary, prepared, as the backend
               sends
record_runs    the same two statements on the backend's own runs table (made by the backend's
               migrations on a namespace of its own: table prefix ``ladder_``), with its
               secondary indexes and checks; no claim function, lock, fence or notice
same_work      :mod:`bench.same_work`: the backend's own claim statement by a bare client
claim          a one-request ``Backend.claim``
=============  ===========================================================================

On the other backends (and in the claim curve) there are no record steps: the rounds are the
primitive, the same-work floor and the claim.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from .same_work import LEASE_MS, PostgresClient, request_params
from .stats import median

__all__ = [
    "LADDER_PREFIX",
    "PK_PREFIX",
    "PostgresRecord",
    "ladder_url",
    "make_records",
    "order",
    "prepare",
    "steps",
    "summary",
]

LADDER_PREFIX = "ladder_"
"""Table prefix of the ladder's own backend namespace (its runs table: ``<schema>.ladder_runs``)."""
PK_PREFIX = "ladder_pk_"
"""Table prefix of the primary-key-only copy of that runs table (``<schema>.ladder_pk_runs``)."""
RECORD_STEPS = ("record_pk", "record_runs")
GAP_S = 0.1
"""Pause between two steps of the ladder (a straggling last call ends in it)."""

INSERT = """
INSERT INTO {runs} AS x (job, slot_key, attempt, slot, run_id, token, instance, trigger, status,
                         fence, started_at, finished_at, lease_expires_at, released, error,
                         reason, requested_by)
VALUES (%(job)s, %(slot_key)s, 1, %(slot)s, %(run_id)s, %(token)s, %(instance)s, %(trigger)s,
        'running', 0, %(now)s, NULL, %(expires)s, false, NULL, NULL, NULL)
ON CONFLICT DO NOTHING
RETURNING {run_columns}
"""
"""A won claim's run record (as ``claim_recorded_one`` inserts it; no fence: 0)."""
READ = """
SELECT {run_columns}
FROM {runs} x
WHERE x.job = %(job)s AND x.slot_key = %(slot_key)s
ORDER BY x.attempt DESC LIMIT 1
"""
"""A loser's read of the winner's record, by the primary key (as the backend's
``current_attempt`` reads it; written here so that a change of the backend's statements does
not stop the ladder, which only needs the table and its columns)."""


def steps(name: str, records: bool = True) -> tuple[str, ...]:
    """The steps of a rate run on backend ``name``, cheapest first; ``records``: with the
    record steps where the backend has them (PostgreSQL)."""
    middle = RECORD_STEPS if records and name == "postgres" else ()
    return ("primitive", *middle, "same_work", "claim")


def order(all_steps: Sequence[str], round_: int) -> list[str]:
    """The steps of round ``round_`` in the order they run: reversed every other round, so no
    step always runs first or right after the same one."""
    return list(all_steps) if round_ % 2 == 0 else list(reversed(all_steps))


def ladder_url(name: str, url: str) -> str | None:
    """The URL of the record steps' backend namespace beside the claim rate's ``url``
    (PostgreSQL only: the other backends have no record steps)."""
    if name != "postgres":
        return None
    return f"{url}{'&' if '?' in url else '?'}table_prefix={LADDER_PREFIX}"


async def prepare(url: str) -> None:
    """Make the ladder's tables on PostgreSQL: the backend's own (its migrations, by starting
    a backend on ``url``) and a copy of its runs table (columns, defaults, identity) with only
    the runs table's primary key. Before the processes start: they only write rows."""
    import psycopg
    from psycopg import sql

    from anarchon import backend_from_url
    from anarchon.backends.postgres._queries import Names

    backend: Any = backend_from_url(url)
    await backend.start()
    await backend.stop()
    runs = Names(backend.schema, LADDER_PREFIX).identifiers()["runs"]
    pk = Names(backend.schema, PK_PREFIX).identifiers()["runs"]
    async with await psycopg.AsyncConnection.connect(backend.dsn, autocommit=True) as conn:
        await conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(pk))
        await conn.execute(
            sql.SQL(
                "CREATE TABLE {} (LIKE {} INCLUDING DEFAULTS INCLUDING IDENTITY "
                "INCLUDING GENERATED)"
            ).format(pk, runs)
        )
        cur = await conn.execute(
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint "
            "WHERE conrelid = %s::regclass AND contype = 'p'",
            (runs.as_string(conn),),
        )
        found = await cur.fetchone()
        if found is None:
            raise RuntimeError(f"record ladder: {runs.as_string(conn)} has no primary key")
        await conn.execute(sql.SQL("ALTER TABLE {} ADD {}").format(pk, sql.SQL(found[0])))


class PostgresRecord(PostgresClient):
    """One client writing claims' run records into one runs table (``prefix``: its table
    prefix), a loser reading the winner's record."""

    def __init__(self, dsn: str, schema: str, prefix: str, instance: str) -> None:
        from anarchon.backends.postgres._queries import Names, Queries, positional

        queries = Queries(Names(schema, prefix))
        self.dsn = dsn
        self.instance = instance
        self.insert, self.insert_names = positional(queries.compose(INSERT).as_bytes(None))
        self.read, self.read_names = positional(queries.compose(READ).as_bytes(None))
        self._token_at = -1

    def params(self, job: str, slot: int, run_id: str, token: str, now: int) -> dict[str, Any]:
        run = request_params(job, slot, run_id, token, self.instance)
        return {**run, "now": now, "expires": now + LEASE_MS}

    async def claim(self, job: str, slot: int, run_id: str, token: str) -> bool:
        """Write the record of ``job``'s ``slot``; True if this call wrote it."""
        from psycopg import AsyncRawCursor

        params = self.params(job, slot, run_id, token, int(time.time() * 1000))
        cur = AsyncRawCursor(self._conn)
        await cur.execute(
            self.insert, [params[n] for n in self.insert_names], binary=True, prepare=True
        )
        if await cur.fetchone() is not None:
            return True
        await cur.execute(
            self.read, [params[n] for n in self.read_names], binary=True, prepare=True
        )
        row = await cur.fetchone()
        if self._token_at < 0:
            assert cur.description is not None
            self._token_at = [c.name for c in cur.description].index("token")
        return row is not None and row[self._token_at] == token


def make_records(name: str, url: str | None, instance: str) -> dict[str, PostgresRecord]:
    """The record steps' clients of backend ``name`` on the ladder's namespace ``url``."""
    if name != "postgres" or url is None:
        return {}
    from anarchon import backend_from_url

    backend: Any = backend_from_url(url)  # only its options: not started
    schema, dsn = backend.schema, backend.dsn
    return {
        "record_pk": PostgresRecord(dsn, schema, PK_PREFIX, instance),
        "record_runs": PostgresRecord(dsn, schema, LADDER_PREFIX, instance),
    }


def _round(answers: list[dict[str, Any]], n: int, step: str, seconds: float) -> dict[str, Any]:
    calls = [a["rounds"][n][step] for a in answers]
    ops = sum(c["ops"] for c in calls)
    wins: dict[int, int] = {}
    for c in calls:
        for k in c["won"]:
            wins[k] = wins.get(k, 0) + 1
    settled = min(c["ops"] for c in calls)
    won = sum(len(c["won"]) for c in calls)
    return {
        "ops": ops,
        "rate": ops / seconds,
        # 1/3 when the three processes raced for every key, 1 when one ran ahead and won all.
        "lead": max(len(c["won"]) for c in calls) / won if won else None,
        "duplicates": sum(w - 1 for w in wins.values() if w > 1),
        "unclaimed": sum(1 for k in range(settled) if k not in wins),
    }


def summary(answers: list[dict[str, Any]], names: Sequence[str]) -> dict[str, Any]:
    """Steps ``names``' rates and shares of the primitive over all the rounds, with every
    round's figures (the answers of every process of one rate run).

    The rate is the step's calls in all its rounds over their time (the mean of the rounds'
    rates) and the share that rate over the primitive's: every step runs as long as the
    primitive, interleaved with it. Of the estimators tried on nine PostgreSQL runs of the
    ladder at load 3-5, this one moved least from run to run: the shares by a standard
    deviation of 0.04 (same-work floor, claim) to 0.09 (record steps), against 0.07-0.10 for
    the median of the rounds' shares and 0.04-0.10 for their geometric mean.
    """
    seconds, rounds = answers[0]["seconds"], len(answers[0]["rounds"])
    per_round = [{s: _round(answers, n, s, seconds) for s in names} for n in range(rounds)]
    out: dict[str, Any] = {"seconds": seconds, "rounds": rounds, "steps": {}}
    for step in names:
        rates = [r[step]["rate"] for r in per_round]
        primitive = [r["primitive"]["rate"] for r in per_round]
        shares = [a / b for a, b in zip(rates, primitive, strict=True) if b]
        out["steps"][step] = {
            "ops": sum(r[step]["ops"] for r in per_round),
            "rate": sum(rates) / rounds if rounds else 0.0,
            "rates": rates,
            "share": sum(rates) / sum(primitive) if sum(primitive) else None,
            "shares": shares,
            "median_share": median(shares),
            "lead": median([r[step]["lead"] for r in per_round if r[step]["lead"] is not None]),
            "duplicates": sum(r[step]["duplicates"] for r in per_round),
            "unclaimed": sum(r[step]["unclaimed"] for r in per_round),
        }
    return out
