"""Two schedulers under one ``instance_id`` (here in one process, on one SQLite file; the real
processes are in tests/integrations/test_instance_identity.py): each finds the other's write,
``scheduler.health()`` reports it, and once one stops the other clears it after 6 heartbeats."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from anarchon import Scheduler
from anarchon.registry import SILENT_HEARTBEATS


async def test_health_reports_an_id_used_twice_until_the_other_stops(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"sqlite:///{tmp_path / 'anarchon.db'}"
    caplog.set_level(logging.INFO, logger="anarchon.scheduler")
    first = Scheduler(url, instance_id="pod-1", heartbeat_ms=100)
    second = Scheduler(url, instance_id="pod-1", heartbeat_ms=100)
    async with first, second:
        for _ in range(100):
            beats = [s._services.heartbeat for s in (first, second)]
            if all(beat and beat.shared_with for beat in beats):
                break
            await asyncio.sleep(0.05)
        health = await first.health()
        assert not health.healthy
        assert any("used by another process too" in p for p in health.problems), health
        await second.stop()
        for _ in range(SILENT_HEARTBEATS * 10):
            if first._services.heartbeat and first._services.heartbeat.shared_with is None:
                break
            await asyncio.sleep(0.05)
        assert (await first.health()).healthy
    actions = [getattr(r, "action", None) for r in caplog.records]
    assert actions.count("instance_id_shared") == 2  # once in each scheduler
    assert actions.count("instance_id_shared_ended") == 1
