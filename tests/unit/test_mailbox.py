"""The cross-thread mailbox: one wake-up per batch, none for a call the loop takes in time."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

from anarchon._keeper import Mailbox


async def _from_thread(fn: Callable[[], object]) -> None:
    thread = threading.Thread(target=fn)
    thread.start()
    await asyncio.to_thread(thread.join)


async def test_post_wakes_the_loop_once_per_batch() -> None:
    mailbox = Mailbox.here()
    seen: list[int] = []

    def post_many() -> None:
        for n in range(100):
            mailbox.post(seen.append, n)

    await _from_thread(post_many)
    for _ in range(100):
        if len(seen) == 100:
            break
        await asyncio.sleep(0.01)
    assert seen == list(range(100))


async def test_a_call_needed_after_the_loop_takes_its_items_does_not_wake_it() -> None:
    mailbox = Mailbox.here()
    seen: list[str] = []
    assert mailbox.take(by_ms=5_000) is False  # the loop will take its items by 5 000 ms
    await _from_thread(lambda: mailbox.post_by(6_000, seen.append, "late"))
    await asyncio.sleep(0.05)
    assert seen == []  # not woken: the loop takes it in time
    assert mailbox.take(by_ms=5_000) is True
    assert seen == ["late"]


async def test_a_call_needed_sooner_wakes_the_loop() -> None:
    mailbox = Mailbox.here()
    seen: list[str] = []
    assert mailbox.take(by_ms=5_000) is False
    await _from_thread(lambda: mailbox.post_by(4_000, seen.append, "soon"))
    for _ in range(100):
        if seen:
            break
        await asyncio.sleep(0.01)
    assert seen == ["soon"]
