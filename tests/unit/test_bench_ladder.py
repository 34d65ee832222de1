# ruff: noqa: RUF001 - the tables use typographic dashes
"""The claim rate's record ladder: its tables follow the backend's runs table, its records are
the backend's records, its rounds alternate and its figures are taken over all the rounds."""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from bench import claim_rate, ladder, probe, report

from anarchon import backend_from_url

ADMIN = "postgresql://127.0.0.1:5432/postgres"
SLOT = 1_764_000_000_000


@pytest.fixture
async def database() -> AsyncIterator[str]:
    """A database of its own (the primitive's table, floor.claims, has a fixed name)."""
    name = f"ladder_test_{uuid.uuid4().hex[:8]}"
    async with await psycopg.AsyncConnection.connect(ADMIN, autocommit=True) as conn:
        await conn.execute(f'CREATE DATABASE "{name}"')
    dsn = f"{ADMIN.rsplit('/', 1)[0]}/{name}"
    try:
        yield dsn
    finally:
        async with await psycopg.AsyncConnection.connect(ADMIN, autocommit=True) as conn:
            await conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


async def _rows(dsn: str, query: str, *params: Any) -> list[tuple[Any, ...]]:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute(query, params)
        return await cur.fetchall()


def _ids() -> tuple[str, str]:
    ids = os.urandom(32).hex()
    return ids[:32], ids[32:]


def test_the_steps_run_forward_then_backward() -> None:
    steps = ladder.steps("postgres")
    assert steps == ("primitive", "record_pk", "record_runs", "same_work", "claim")
    assert ladder.order(steps, 0) == list(steps)
    assert ladder.order(steps, 1) == list(reversed(steps))
    assert ladder.order(steps, 2) == list(steps)
    # No record steps where there is no runs table to write.
    assert ladder.steps("redis") == ("primitive", "same_work", "claim")
    assert ladder.ladder_url("redis", "redis://h/0?prefix=x:") is None
    assert ladder.ladder_url("postgres", "postgresql://h/db?schema=rate") == (
        "postgresql://h/db?schema=rate&table_prefix=ladder_"
    )


async def test_the_ladders_tables_follow_the_backends_runs_table(database: str) -> None:
    url = ladder.ladder_url("postgres", f"{database}?schema=rate")
    assert url is not None
    await ladder.prepare(url)
    await ladder.prepare(url)  # again (a second rate run on one database): made afresh

    def columns(table: str) -> str:
        return (
            "SELECT column_name, data_type, is_nullable, is_identity, column_default "
            f"FROM information_schema.columns WHERE table_schema = 'rate' AND table_name = "
            f"'{table}' ORDER BY ordinal_position"
        )

    runs = await _rows(database, columns("ladder_runs"))
    assert [c[0] for c in runs][:3] == ["job", "slot_key", "attempt"]
    assert await _rows(database, columns("ladder_pk_runs")) == runs

    def indexes(table: str) -> str:
        return (
            f"SELECT indexdef FROM pg_indexes WHERE schemaname = 'rate' AND tablename = '{table}'"
        )

    pk_indexes = [r[0] for r in await _rows(database, indexes("ladder_pk_runs"))]
    assert len(pk_indexes) == 1
    assert "UNIQUE" in pk_indexes[0] and "(job, slot_key, attempt)" in pk_indexes[0]
    assert len(await _rows(database, indexes("ladder_runs"))) > 1
    checks = "SELECT count(*) FROM pg_constraint WHERE conrelid = %s::regclass AND contype = 'c'"
    assert (await _rows(database, checks, "rate.ladder_runs"))[0][0] >= 1
    assert (await _rows(database, checks, "rate.ladder_pk_runs"))[0][0] == 0


async def test_record_steps_write_the_records_the_backend_reads(database: str) -> None:
    url = ladder.ladder_url("postgres", f"{database}?schema=rate")
    assert url is not None
    await ladder.prepare(url)
    first = ladder.make_records("postgres", url, "rate0")
    second = ladder.make_records("postgres", url, "rate1")
    assert sorted(first) == ["record_pk", "record_runs"]
    for client in [*first.values(), *second.values()]:
        await client.open()
    try:
        for step in ("record_pk", "record_runs"):
            winner = _ids()
            assert await first[step].claim("l0", SLOT, *winner)
            assert not await second[step].claim("l0", SLOT, *_ids())
            assert await first[step].claim("l0", SLOT, *winner)  # the same token: still ours
            assert await second[step].claim("l0", SLOT + 1000, *_ids())
        table = "SELECT count(*) FROM rate.{} WHERE job = 'l0'"
        assert (await _rows(database, table.format("ladder_pk_runs")))[0][0] == 2
    finally:
        for client in [*first.values(), *second.values()]:
            await client.close()
    # The runs table's records are ones the backend reads as its own.
    backend = backend_from_url(url)
    await backend.start()
    try:
        history = await backend.history("l0")
    finally:
        await backend.stop()
    assert sorted((r.slot_ms, r.instance, r.status.value) for r in history) == [
        (SLOT, "rate0", "running"),
        (SLOT + 1000, "rate1", "running"),
    ]


async def _probe(database: str, out: Path, rounds: int, prepared: bool) -> dict[str, Any]:
    """One rate probe on ``database`` (0.2 s loops), then ``rounds`` ladder rounds."""
    async with await psycopg.AsyncConnection.connect(database, autocommit=True) as conn:
        await conn.execute("CREATE SCHEMA floor")
        await conn.execute("CREATE TABLE floor.claims (k text PRIMARY KEY)")
    rate_url = f"{database}?schema=rate"
    url = ladder.ladder_url("postgres", rate_url)
    assert url is not None
    if prepared:
        await ladder.prepare(url)
    argv = ["rate", "--backend", "postgres", "--params", json.dumps({"dsn": database})]
    argv += ["--url", rate_url, "--start-at", str(time.time() + 0.3), "--seconds", "0.2"]
    argv += ["--ladder-rounds", str(rounds), "--ladder-seconds", "0.2", "--ladder-url", url]
    return await probe.rate(probe.parse([*argv, "--out", str(out), "--run", "t1"]))


async def test_a_rate_probe_runs_the_ladders_rounds(
    database: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(probe, "GAP_S", 0.05)
    answer = await _probe(database, tmp_path / "out.json", 2, prepared=True)
    rounds = answer["ladder"]["rounds"]
    assert len(rounds) == 2
    assert all(sorted(r) == sorted(ladder.steps("postgres")) for r in rounds)
    # One process: it wins every key it reaches, and each record step's records are there.
    for step in ("record_pk", "record_runs"):
        table = "ladder_pk_runs" if step == "record_pk" else "ladder_runs"
        written = (await _rows(database, f"SELECT count(*) FROM rate.{table}"))[0][0]
        assert written == sum(r[step]["ops"] for r in rounds) > 0
    found = ladder.summary([answer])
    assert found["rounds"] == 2
    assert found["steps"]["primitive"]["share"] == 1.0
    for step in ladder.steps("postgres"):
        assert found["steps"][step]["rate"] > 0
        assert found["steps"][step]["duplicates"] == found["steps"][step]["unclaimed"] == 0


async def test_a_ladder_that_fails_leaves_the_rate_loops_figures(
    database: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(probe, "GAP_S", 0.05)
    # The ladder's tables never made (prepare() not run): its first insert fails.
    answer = await _probe(database, tmp_path / "out.json", 1, prepared=False)
    assert "ladder" not in answer
    assert "UndefinedTable" in answer["ladder_error"]
    assert answer["claim"]["ops"] > 0 and answer["primitive"]["ops"] > 0


def _answer(rounds: list[dict[str, tuple[int, list[int]]]]) -> dict[str, Any]:
    return {
        "ladder": {
            "steps": ["primitive", "record_pk"],
            "seconds": 0.5,
            "rounds": [
                {s: {"ops": ops, "won": won} for s, (ops, won) in r.items()} for r in rounds
            ],
        }
    }


def test_a_steps_figures_are_taken_over_all_its_rounds() -> None:
    # Two processes, three rounds; process b wins key 1 of record_pk in round 0 as well (a
    # duplicate), and nobody wins key 2 of round 1, which both reached.
    a = _answer(
        [
            {"primitive": (500, list(range(500))), "record_pk": (400, [0, 1])},
            {"primitive": (100, list(range(100))), "record_pk": (100, [0, 1])},
            {"primitive": (400, list(range(400))), "record_pk": (100, list(range(100)))},
        ]
    )
    b = _answer(
        [
            {"primitive": (500, []), "record_pk": (400, [1, *range(2, 400)])},
            {"primitive": (100, []), "record_pk": (100, list(range(3, 100)))},
            {"primitive": (400, []), "record_pk": (100, [])},
        ]
    )
    found = ladder.summary([a, b])
    assert found["rounds"] == 3 and found["seconds"] == 0.5
    prim, rec = found["steps"]["primitive"], found["steps"]["record_pk"]
    assert prim["rates"] == [2000.0, 400.0, 1600.0]
    assert prim["rate"] == 4000.0 / 3
    assert rec["rates"] == [1600.0, 400.0, 400.0]
    assert rec["rate"] == 800.0
    assert rec["shares"] == [0.8, 1.0, 0.25]
    assert rec["median_share"] == 0.8
    assert rec["share"] == 0.6  # all rounds' calls over the primitive's, not a round's median
    assert rec["duplicates"] == 1
    assert rec["unclaimed"] == 1
    # Round 0: b won 399 of the 401 wins; round 1: b 97 of 99; round 2: a all of them.
    assert rec["lead"] == 399 / 401  # the median round
    assert prim["lead"] == 1.0


def test_one_process_without_its_ladder_makes_the_rows_ladder_an_error() -> None:
    whole = _answer([{"primitive": (10, list(range(10))), "record_pk": (10, list(range(10)))}])
    assert claim_rate._ladder([whole, whole])["ladder"]["rounds"] == 1
    failed = {"ladder_error": "UndefinedTable: relation does not exist"}
    assert claim_rate._ladder([whole, failed]) == failed


def test_the_ladder_table_shows_each_steps_median_and_range() -> None:
    step = {"rate": 600.0, "rates": [1600.0, 360.0, 600.0], "share": 0.8}
    step |= {"shares": [0.8, 0.9, 0.5], "lead": 0.5, "duplicates": 0, "unclaimed": 0}
    row: dict[str, Any] = {
        "primitive": {"rate": 1000.0, "duplicates": 0, "unclaimed": 0},
        "claim": {"rate": 500.0, "duplicates": 0, "unclaimed": 0},
        "share": 0.5,
        "ladder": {"rounds": 3, "seconds": 0.5, "steps": {"record_pk": step}},
    }
    results = {
        "targets": {"postgres": {"available": True, "lease": True}},
        "rate": {"postgres": row},
    }
    text = "\n".join(report.rate_section(results))
    assert "run 3 rounds of every step below, 0.5 s each" in text
    assert "| postgres | run record, primary key only |" in text
    assert "| 600/s | 360–1,600/s | 80 % | 50 %–90 % | 50 % | 0 / 0 |" in text
    step["shares"] = []  # no primitive in any round: no share
    assert "| 600/s | 360–1,600/s | 80 % | – | 50 % | 0 / 0 |" in "\n".join(
        report.rate_section(results)
    )
    # No ladder, no ladder table.
    del row["ladder"]
    assert "Record ladder" not in "\n".join(report.rate_section(results))
    # A ladder that could not be prepared says why.
    row["ladder_error"] = "UndefinedTable: relation does not exist"
    text = "\n".join(report.rate_section(results))
    assert "Record ladder on postgres not run: UndefinedTable: relation does not exist" in text
