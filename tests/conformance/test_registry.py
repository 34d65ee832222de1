"""The registry (issue 13, items 1 and 2) on every backend, against the real services."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import pytest

from anarchon import Scheduler

pytestmark = pytest.mark.timeout(120)


# The store's own steps (records, silent removal, definitions sets, 100 000 jobs) are the
# shipped contract's: anarchon.testing._registry.RegistryContract, run by test_contract.py.


async def test_schedulers_see_each_other_and_the_drift(
    schedulers: Callable[..., list[Scheduler]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    a, b, c = schedulers(3, heartbeat_ms=200)

    async def handler(ctx: object) -> None:
        pass

    a.add("sync", "0 0 1 1 *", handler)
    b.add("sync", "0 0 1 1 *", handler)
    c.add("sync", "0 0 2 1 *", handler)
    caplog.set_level(logging.WARNING, logger="anarchon.scheduler")
    for scheduler in (a, b, c):
        await scheduler.start()
    deadline = time.monotonic() + 20
    while True:
        view = await a.cluster()
        if len(view.instances) == 3 and view.drift:
            break
        assert time.monotonic() < deadline, view
        await asyncio.sleep(0.1)
    assert [i.id for i in view.instances] == [a.instance_id, b.instance_id, c.instance_id]
    assert all(view.now_ms - i.heartbeat_ms < 10_000 for i in view.instances)
    (drift,) = view.drift
    assert [ids for _, ids in drift.variants] == [
        (a.instance_id, b.instance_id),
        (c.instance_id,),
    ]
    assert [d.expression for d in view.definitions["sync"]] == ["0 0 1 1 *", "0 0 2 1 *"]
    await asyncio.sleep(1)  # several heartbeats: still one warning per instance
    warned = [r for r in caplog.records if getattr(r, "action", "") == "definition_drift"]
    assert 1 <= len(warned) <= 3, warned
    assert "'0 0 2 1 *'" in warned[0].getMessage()
    await c.stop()  # a clean stop removes its record at once
    ids = [i.id for i in (await a.cluster()).instances]
    assert ids == [a.instance_id, b.instance_id]
    assert not (await a.cluster()).drift
