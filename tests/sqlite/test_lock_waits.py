"""The waits of a SQLite write that finds another process's transaction under way."""

from __future__ import annotations

import itertools

from anarchon.backends.sqlite._options import lock_waits


def test_waits_start_short_and_double_to_two_milliseconds() -> None:
    waits = list(itertools.islice(lock_waits(), 20))
    # A claim's transaction holds the lock about a millisecond: the first tries come soon after
    # (SQLite's own busy handler sleeps 1, 2, 5, 10 ... ms); a long wait tries every 2 ms.
    assert waits[:5] == [0.000_25, 0.000_5, 0.001, 0.002, 0.002]
    assert max(waits) == 0.002
