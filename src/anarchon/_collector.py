"""The garbage collector held back while a burst's runs are started, and given back after.

A burst of 10 000 slots due at once keeps about a dozen objects alive per run while its claims
go out part by part (the task, its coroutine and context, the awaited result, the run's
records): the collector's automatic passes walked them again and again, a third of the core's
CPU between the slot and its last run started (two full passes over every object of the process
among them). While a burst is being claimed (:class:`anarchon._claims.Claims`, more than one
part), automatic collection is paused, at most :data:`MAX_PAUSE_S`; it resumes as soon as the
burst's last runs have started, and its first pass then collects what the burst left.

Only what the process had: a collector the application disabled is left disabled, and never
enabled by a pause that ends; pauses of several schedulers (threads, loops) nest; a child forked
during a pause gets the collector back as it was. Cyclic garbage made meanwhile waits for that
first pass; nothing else changes.
"""

from __future__ import annotations

import asyncio
import gc
import os
import threading
from typing import Final

__all__ = ["MAX_PAUSE_S", "Pause", "pause"]

# A burst claimed from a slow backend (seconds for 10 000 claims over the network) does not
# keep the collector waiting for all of it.
MAX_PAUSE_S: Final = 1.0


class _Paused:
    """The process's pauses: how many are on, and whether they disabled the collector."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.count = 0
        self.disabled = False  # by a pause: the collector was enabled when the first began

    def begin(self) -> None:
        with self.lock:
            if not self.count:
                self.disabled = gc.isenabled()
                if self.disabled:
                    gc.disable()
            self.count += 1

    def end(self) -> None:
        with self.lock:
            self.count -= 1
            if not self.count and self.disabled:
                self.disabled = False
                gc.enable()

    def forked(self) -> None:
        """In a child forked during a pause: nothing would end it there."""
        self.lock = threading.Lock()
        if self.count and self.disabled:
            gc.enable()
        self.count, self.disabled = 0, False


_PAUSED: Final = _Paused()
os.register_at_fork(after_in_child=_PAUSED.forked)


class Pause:
    """One pause of automatic collection; :meth:`end` it (more calls do nothing). It ends by
    itself after :data:`MAX_PAUSE_S` on the running loop."""

    __slots__ = ("_ended", "_timer")

    def __init__(self) -> None:
        self._ended = False
        _PAUSED.begin()
        self._timer = asyncio.get_running_loop().call_later(MAX_PAUSE_S, self.end)

    def end(self) -> None:
        """Resume automatic collection (when no other pause is on)."""
        if self._ended:
            return
        self._ended = True
        self._timer.cancel()
        _PAUSED.end()


def pause() -> Pause:
    """Pause automatic garbage collection until the returned :class:`Pause` ends."""
    return Pause()
