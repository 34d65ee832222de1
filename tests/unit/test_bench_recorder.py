"""The bench's recorder: records written as JSON lines once they stop arriving."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path

import pytest
from bench.peers import _record
from bench.peers._record import Recorder


def _lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_with_flush_ms_zero_each_record_is_written_at_once(tmp_path: Path) -> None:
    path = tmp_path / "w.jsonl"
    recorder = Recorder(str(path), flush_ms=0)
    recorder.start("j", 1_000, a=1)
    [record] = _lines(path)
    assert (record["e"], record["j"], record["s"], record["a"]) == ("start", "j", 1_000, 1)


async def test_records_are_written_once_they_stop_arriving(tmp_path: Path) -> None:
    path = tmp_path / "w.jsonl"
    recorder = Recorder(str(path), flush_ms=20)
    flusher = asyncio.ensure_future(recorder.run())
    try:
        # A record at every step of the loop for 0.2 s: every look finds new ones (this task
        # is always ready, so it adds one between any two looks), so nothing is written yet.
        loop = asyncio.get_running_loop()
        n, until = 0, loop.time() + 0.2
        while loop.time() < until:
            recorder.start("j", n)
            n += 1
            await asyncio.sleep(0)
        assert _lines(path) == []
        for _ in range(250):  # then a quiet look writes them all, in order
            await asyncio.sleep(0.02)
            if path.exists():
                break
        assert [r["s"] for r in _lines(path)] == list(range(n))
    finally:
        flusher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await flusher


async def test_records_that_keep_arriving_are_written_after_max_defer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_record, "MAX_DEFER_S", 0.1)
    path = tmp_path / "w.jsonl"
    recorder = Recorder(str(path), flush_ms=20)
    flusher = asyncio.ensure_future(recorder.run())
    n = 0
    try:
        loop = asyncio.get_running_loop()
        until = loop.time() + 5
        while not path.exists() and loop.time() < until:  # never quiet: a record every step
            recorder.start("j", n)
            n += 1
            await asyncio.sleep(0)
        written = _lines(path)
        assert written and [r["s"] for r in written] == list(range(len(written))), written
    finally:
        flusher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await flusher
    # Cancelled: what was still queued is written too.
    assert [r["s"] for r in _lines(path)] == list(range(n))
