"""Backoff for calls to a backend that is unavailable."""

from __future__ import annotations

import random
from collections.abc import Iterator

__all__ = ["backoff"]


def backoff(first: float = 0.1, cap: float = 5.0) -> Iterator[float]:
    """Yield delays in seconds: exponential from ``first`` up to ``cap``, with full jitter on
    the upper half so many instances do not retry in step."""
    delay = first
    while True:
        yield delay / 2 + random.random() * delay / 2
        delay = min(cap, delay * 2)
