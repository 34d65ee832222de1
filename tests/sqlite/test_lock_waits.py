"""The waits of a SQLite write that finds another process's transaction under way."""

from __future__ import annotations

import itertools

from anarchon.backends.sqlite._options import lock_waits


def test_waits_stay_short_while_a_few_claims_commit_then_grow() -> None:
    waits = list(itertools.islice(lock_waits(), 400))
    assert waits[:3] == [0.000_1, 0.000_2, 0.000_25]
    # The first 20 ms are waited in steps of at most 0.25 ms: a claim's transaction holds the
    # lock about a millisecond, so a waiter takes it well under a millisecond after it frees.
    total, n = 0.0, 0
    while total < 0.02:
        assert waits[n] <= 0.000_25
        total += waits[n]
        n += 1
    # Then the steps double to 2 ms: a long wait does not try thousands of times a second.
    assert waits[n : n + 4] == [0.000_5, 0.001, 0.002, 0.002]
    assert max(waits) == 0.002
