# ruff: noqa: RUF001 - the tables use typographic dashes
"""The claim rate's alternated rounds and record ladder: its tables follow the backend's runs
table, its records are the backend's records, its rounds alternate, and every figure of the
section (the headline's ratios too) is taken over all the rounds."""

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
    # No record steps where there is no runs table to write, nor where none are wanted.
    assert ladder.steps("redis") == ("primitive", "same_work", "claim")
    assert ladder.steps("postgres", records=False) == ("primitive", "same_work", "claim")
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
    """One rate probe on ``database``: ``rounds`` rounds of 0.2 s steps."""
    async with await psycopg.AsyncConnection.connect(database, autocommit=True) as conn:
        await conn.execute("CREATE SCHEMA floor")
        await conn.execute("CREATE TABLE floor.claims (k text PRIMARY KEY)")
    rate_url = f"{database}?schema=rate"
    url = ladder.ladder_url("postgres", rate_url)
    assert url is not None
    if prepared:
        await ladder.prepare(url)
    argv = ["rate", "--backend", "postgres", "--params", json.dumps({"dsn": database})]
    argv += ["--url", rate_url, "--start-at", str(time.time() + 0.5), "--seconds", "0.2"]
    argv += ["--rounds", str(rounds), "--record-url", url]
    return await probe.rate(probe.parse([*argv, "--out", str(out), "--run", "t1"]))


async def test_a_rate_probe_runs_every_step_in_alternated_rounds(
    database: str, tmp_path: Path
) -> None:
    began = time.time()
    answer = await _probe(database, tmp_path / "out.json", 2, prepared=True)
    rounds = answer["rounds"]
    assert len(rounds) == 2
    assert answer["steps"] == list(ladder.steps("postgres"))
    assert all(sorted(r) == sorted(ladder.steps("postgres")) for r in rounds)
    # Two rounds of five 0.2 s steps a tenth of a second apart, after the lead: no 3 s loops.
    assert time.time() - began < 0.5 + 2 * 5 * 0.3 + 2
    # One process: it wins every key it reaches, and each record step's records are there
    # (the warm-up's apart: its jobs are its own).
    for step in ("record_pk", "record_runs"):
        table = "ladder_pk_runs" if step == "record_pk" else "ladder_runs"
        query = f"SELECT count(*) FROM rate.{table} WHERE job LIKE %s"
        written = (await _rows(database, query, "lt1x%"))[0][0]
        assert written == sum(r[step]["ops"] for r in rounds) > 0
    # Round trips: the headline steps', every call of every round.
    assert sorted(answer["lat_ms"]) == ["claim", "primitive", "same_work"]
    for step, lat in answer["lat_ms"].items():
        assert len(lat) == sum(r[step]["ops"] for r in rounds)
    found = claim_rate.figures([answer])
    assert found["rounds"] == 2 and found["seconds"] == 0.2
    assert found["steps"]["primitive"]["share"] == 1.0
    for step in ladder.steps("postgres"):
        assert found["steps"][step]["rate"] > 0
        assert found["steps"][step]["duplicates"] == found["steps"][step]["unclaimed"] == 0
    assert found["share"] == found["steps"]["claim"]["share"]
    assert found["claim_lat"]["calls"] == found["steps"]["claim"]["ops"]


async def test_record_steps_that_fail_leave_the_other_steps_figures(
    database: str, tmp_path: Path
) -> None:
    # The record tables never made (prepare() not run): the warm-up's first insert fails.
    answer = await _probe(database, tmp_path / "out.json", 2, prepared=False)
    assert "UndefinedTable" in answer["record_error"]
    for r in answer["rounds"]:
        assert r["record_pk"]["ops"] == r["record_runs"]["ops"] == 0
    # The other steps ran: over both rounds (one 0.2 s step of a loaded machine may do none).
    for step in ("claim", "primitive"):
        assert sum(r[step]["ops"] for r in answer["rounds"]) > 0, step
    found = claim_rate.figures([answer])
    assert list(found["steps"]) == ["primitive", "same_work", "claim"]
    assert found["record_error"] == answer["record_error"]
    assert found["share"] is not None and found["share"] > 0


def _answer(rounds: list[dict[str, tuple[int, list[int]]]]) -> dict[str, Any]:
    """One process's answer: ``rounds`` of (calls, keys won) per step, a round trip per call."""
    lat = {s: [1.0] * sum(r[s][0] for r in rounds) for s in probe.LATENCY_STEPS if s in rounds[0]}
    return {
        "steps": list(rounds[0]),
        "seconds": 0.5,
        "rounds": [{s: {"ops": ops, "won": won} for s, (ops, won) in r.items()} for r in rounds],
        "lat_ms": lat,
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
    found = ladder.summary([a, b], ["primitive", "record_pk"])
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


def _steps(primitive: int, same_work: int, claim: int) -> dict[str, tuple[int, list[int]]]:
    return {
        "primitive": (primitive, list(range(primitive))),
        "record_pk": (primitive, list(range(primitive))),
        "same_work": (same_work, list(range(same_work))),
        "claim": (claim, list(range(claim))),
    }


def test_the_headline_is_read_from_the_rounds() -> None:
    # Round 0 fast (one process ran ahead), round 1 slow (all raced): the headline's ratios are
    # the rates over both rounds, as the steps table's shares, not one round's.
    whole = _answer([_steps(500, 300, 200), _steps(100, 90, 80)])
    found = claim_rate.figures([whole])
    assert found["steps"]["claim"]["rate"] == (200 + 80) / 0.5 / 2
    assert found["share"] == found["steps"]["claim"]["share"] == 280 / 600
    assert found["same_share"] == 390 / 600
    assert found["python_share"] == 280 / 390
    assert found["claim_lat"]["calls"] == 280
    assert "record_pk" in found["steps"] and "record_error" not in found
    # One process whose record steps failed: they are left out of every process's figures.
    failed = whole | {"record_error": "UndefinedTable: relation does not exist"}
    found = claim_rate.figures([whole, failed])
    assert "record_pk" not in found["steps"]
    assert found["record_error"] == "UndefinedTable: relation does not exist"


def test_the_ladder_table_shows_each_steps_median_and_range() -> None:
    step = {"rate": 600.0, "rates": [1600.0, 360.0, 600.0], "share": 0.8}
    step |= {"shares": [0.8, 0.9, 0.5], "lead": 0.5, "duplicates": 0, "unclaimed": 0}
    other = {"rates": [500.0], "shares": [0.5], "lead": 0.4, "duplicates": 0, "unclaimed": 0}
    row: dict[str, Any] = {
        "rounds": 3,
        "seconds": 0.5,
        "steps": {
            "primitive": other | {"rate": 1000.0, "share": 1.0},
            "record_pk": step,
            "same_work": other | {"rate": 800.0, "share": 0.8},
            "claim": other | {"rate": 500.0, "share": 0.5},
        },
        "share": 0.5,
        "same_share": 0.8,
        "python_share": 0.625,
    }
    results = {
        "targets": {"postgres": {"available": True, "lease": True}},
        "rate": {"postgres": row},
    }
    text = "\n".join(report.rate_section(results))
    assert "The three processes run 3 rounds of every step, 0.5 s each" in text
    assert "| postgres | 1,000/s | 800/s | 500/s | 50 % | **not met** | 80 % | 62 % |" in text
    assert "| postgres | run record, primary key only |" in text
    assert "| 600/s | 360–1,600/s | 80 % | 50 %–90 % | 50 % | 0 / 0 |" in text
    step["shares"] = []  # no primitive in any round: no share
    assert "| 600/s | 360–1,600/s | 80 % | – | 50 % | 0 / 0 |" in "\n".join(
        report.rate_section(results)
    )
    # Record steps that could not run say why; the rest of the rounds stand.
    del row["steps"]["record_pk"]
    row["record_error"] = "UndefinedTable: relation does not exist"
    text = "\n".join(report.rate_section(results))
    assert "Record steps on postgres not run: UndefinedTable: relation does not exist" in text
    assert "| postgres | 1,000/s | 800/s | 500/s | 50 % |" in text
    assert "| postgres | claim | 500/s |" in text
