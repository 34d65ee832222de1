"""Threads for plain (non-async) handlers: a pool of daemon threads of the scheduler's own.

Two differences from :class:`concurrent.futures.ThreadPoolExecutor`, both needed for the
scheduler's promises:

* **Capacity is reserved before a claim.** A slot of a plain job is claimed only once a thread
  is set aside for it (:meth:`HandlerThreads.reserve`); with every thread busy the instance does
  not claim, so another instance runs the slot instead of this one holding a lease on a run that
  waits for a thread.
* **Daemon threads.** A handler stuck in a blocking call cannot be stopped from outside; the
  process must still exit after ``grace_ms``. Python joins a ``ThreadPoolExecutor``'s threads at
  exit, so one hung handler would keep the process alive; daemon threads are abandoned instead
  (and :meth:`HandlerThreads.busy` names them, for the log).
"""

from __future__ import annotations

import contextvars
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

__all__ = ["HandlerThreads", "NoThreadFree"]

T = TypeVar("T")

_Item = tuple[Future[Any], Callable[[], Any], int]


class NoThreadFree(Exception):
    """Raised by :meth:`HandlerThreads.submit` without a reservation when every thread is busy."""


class HandlerThreads:
    """Up to ``max_workers`` daemon threads, made on demand and kept for reuse.

    ``reserve()`` sets a thread aside (counted, not yet started); ``submit(..., reserved=True)``
    runs a call on it; ``unreserve()`` gives an unused reservation back. Thread-safe.
    """

    def __init__(self, max_workers: int, name: str = "anarchon-job") -> None:
        self.max_workers = max_workers
        self._name = name
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._idle = 0
        self._reserved = 0
        self._calls: dict[int, str] = {}  # submitted and not yet returned: id -> label
        self._ids = 0
        self._closed = False

    @property
    def free(self) -> int:
        """Threads neither running (or about to run) a handler nor reserved for one."""
        with self._lock:
            return self.max_workers - len(self._calls) - self._reserved

    def reserve(self) -> bool:
        """Set a thread aside for a call about to be submitted; False if none is free."""
        with self._lock:
            if self._closed or len(self._calls) + self._reserved >= self.max_workers:
                return False
            self._reserved += 1
            return True

    def unreserve(self) -> None:
        """Give back a reservation that will not be used (the claim was lost or skipped)."""
        with self._lock:
            if self._reserved > 0:
                self._reserved -= 1

    def submit(self, fn: Callable[[], T], label: str, *, reserved: bool) -> Future[T]:
        """Run ``fn`` on a thread (in a copy of the caller's context vars); ``label`` names it
        in :meth:`busy`. With ``reserved`` the call uses a reservation made before; without,
        it raises :class:`NoThreadFree` when no thread is free."""
        future: Future[T] = Future()
        call = contextvars.copy_context().run
        with self._lock:
            if reserved and self._reserved > 0:
                self._reserved -= 1
            elif len(self._calls) + self._reserved >= self.max_workers:
                raise NoThreadFree(f"all {self.max_workers} handler threads are busy")
            self._ids += 1
            self._calls[self._ids] = label
            self._queue.put((future, lambda: call(fn), self._ids))
            if self._idle > 0 and not self._closed:  # closed: idle threads are leaving
                self._idle -= 1
            else:
                thread = threading.Thread(
                    target=self._work, name=f"{self._name}-{len(self._threads)}", daemon=True
                )
                self._threads.append(thread)
                thread.start()
        return future

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            future, fn, call_id = item
            try:
                if future.set_running_or_notify_cancel():
                    try:
                        result = fn()
                    except BaseException as exc:  # SystemExit too: it is the handler's failure
                        future.set_exception(exc)
                    else:
                        future.set_result(result)
            finally:
                with self._lock:
                    del self._calls[call_id]
                    self._idle += 1
            del item, future, fn

    def busy(self) -> list[str]:
        """Labels of the calls submitted and not yet returned."""
        with self._lock:
            return sorted(self._calls.values())

    def close(self) -> None:
        """Let idle threads end; busy ones are abandoned (they are daemon threads)."""
        with self._lock:
            self._closed = True
            for _ in self._threads:
                self._queue.put(None)
