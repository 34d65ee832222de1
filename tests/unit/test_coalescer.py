"""Coalescer: items submitted together go in batches of at most MAX_BATCH, each caller gets its
own item's result, and one bad item fails only its caller."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from anarchon._batch import MAX_BATCH, MAX_HELD, Coalescer
from anarchon.errors import BackendUnavailable


def _multiplying(batches: list[int], factor: int = 1) -> Coalescer[int, int]:
    """A coalescer whose backend answers each item times ``factor`` (by default the item
    itself), noting each batch's size."""

    async def multiply(items: Sequence[int]) -> Sequence[int | BaseException]:
        batches.append(len(items))
        return [item * factor for item in items]

    return Coalescer(multiply, str, "multiplying")


async def test_items_submitted_together_are_batched_and_answered_in_order() -> None:
    batches: list[int] = []
    coalescer = _multiplying(batches, 2)
    futures = [coalescer.submit(n) for n in range(MAX_BATCH + 3)]
    assert await asyncio.gather(*futures) == [n * 2 for n in range(MAX_BATCH + 3)]
    assert batches == [MAX_BATCH, 3]
    assert await coalescer.submit(21) == 42
    assert batches == [MAX_BATCH, 3, 1]


async def test_one_bad_item_fails_only_its_caller() -> None:
    async def refuse_seven(items: Sequence[int]) -> Sequence[int | BaseException]:
        if 7 in items:
            raise ValueError("seven is refused")
        return list(items)

    coalescer: Coalescer[int, int] = Coalescer(refuse_seven, str, "echo")
    futures = [coalescer.submit(n) for n in range(10)]
    results = await asyncio.gather(*futures, return_exceptions=True)
    assert [r for r in results if not isinstance(r, BaseException)] == [0, 1, 2, 3, 4, 5, 6, 8, 9]
    assert isinstance(results[7], ValueError)


async def test_an_unavailable_backend_reaches_every_caller() -> None:
    async def down(items: Sequence[int]) -> Sequence[int | BaseException]:
        raise BackendUnavailable("down")

    coalescer: Coalescer[int, int] = Coalescer(down, str, "echo")
    futures = [coalescer.submit(n) for n in range(3)]
    for future in futures:
        with pytest.raises(BackendUnavailable):
            await future


async def test_a_hold_keeps_items_back_until_released_then_sends_them_together() -> None:
    batches: list[int] = []
    coalescer = _multiplying(batches, 2)
    coalescer.hold()
    coalescer.hold()  # holds nest
    first = [coalescer.submit(n) for n in range(3)]
    await asyncio.sleep(0.01)
    later = [coalescer.submit(n) for n in range(3, 5)]
    coalescer.release()
    await asyncio.sleep(0.01)
    assert coalescer.held and not batches and not any(f.done() for f in first + later)
    coalescer.release()
    assert await asyncio.gather(*first, *later) == [0, 2, 4, 6, 8]
    assert batches == [5]
    assert await coalescer.submit(21) == 42  # not held any more
    assert batches == [5, 1]


async def test_flush_sends_what_a_hold_kept_back_and_the_hold_goes_on() -> None:
    batches: list[int] = []
    coalescer = _multiplying(batches)
    coalescer.hold()
    kept = [coalescer.submit(n) for n in range(2)]
    coalescer.flush()
    assert await asyncio.gather(*kept) == [0, 1]
    after = coalescer.submit(7)
    await asyncio.sleep(0.01)
    assert batches == [2] and not after.done()
    coalescer.release()
    assert await after == 7
    assert batches == [2, 1]


async def test_a_hold_keeps_at_most_max_held_items_back() -> None:
    batches: list[int] = []
    coalescer = _multiplying(batches)
    coalescer.hold()
    futures = [coalescer.submit(n) for n in range(MAX_HELD)]
    await asyncio.gather(*futures)
    assert sum(batches) == MAX_HELD
    after = coalescer.submit(7)
    await asyncio.sleep(0.01)
    assert not after.done()
    coalescer.release()
    assert await after == 7
