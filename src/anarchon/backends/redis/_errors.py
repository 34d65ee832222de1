"""The one place where calls to Redis are made safe: errors translated, time bounded.

Transient (:class:`~anarchon.errors.BackendUnavailable`, retried with backoff by the core):
connection refused or lost, timeouts, a server still loading its data set, a cluster that is
down or resharding, writes refused by a replica during a failover, a server out of memory or
busy with a script. Permanent (:class:`~anarchon.errors.BackendError`): authentication,
permissions, anything else the server answers with an error.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

from ...errors import AnarchonError, BackendError, BackendUnavailable

__all__ = ["guarded", "translate"]

T = TypeVar("T")

# Error replies (by their first word) that say "not now" rather than "never".
TRANSIENT_REPLIES = ("BUSY", "MISCONF", "NOREPLICAS", "OOM", "LOADING", "MASTERDOWN", "READONLY")


def translate(exc: BaseException, where: str) -> BackendError:
    """Return the anarchon error for a driver exception raised while talking to ``where``."""
    import redis.exceptions as rx

    text = f"Redis {where}: {type(exc).__name__}: {exc}"
    if isinstance(exc, rx.AuthenticationError | rx.AuthorizationError | rx.NoPermissionError):
        return BackendError(text + " (check the URL's credentials and the user's ACL)")
    transient = (
        rx.ConnectionError,  # also BusyLoadingError, MasterNotFoundError (Sentinel)
        rx.TimeoutError,
        rx.ClusterDownError,  # also MasterDownError
        rx.TryAgainError,
        rx.ReadOnlyError,
        rx.OutOfMemoryError,
        rx.ClusterError,
        rx.RedisClusterException,  # e.g. SlotNotCoveredError while the cluster reshapes
        ConnectionError,
        TimeoutError,
        OSError,
    )
    if isinstance(exc, transient):
        return BackendUnavailable(text)
    if isinstance(exc, rx.ResponseError) and str(exc).split(" ", 1)[0] in TRANSIENT_REPLIES:
        return BackendUnavailable(text)
    return BackendError(text)


def is_driver_error(exc: BaseException) -> bool:
    """True for what redis-py raises when a call fails (not for bugs in our code)."""
    import redis.exceptions as rx

    return isinstance(exc, rx.RedisError | rx.RedisClusterException | OSError | TimeoutError)


async def guarded(aw: Awaitable[T], where: str, timeout_s: float | None) -> T:
    """Await a call to Redis: driver errors translated, abandoned after ``timeout_s``.

    The call runs in a task of its own behind :func:`asyncio.shield`, so cancelling the caller
    always cancels the caller. redis-py (>= 8 sends every command through
    ``asyncio.wait_for`` when ``socket_timeout`` is set, its default) can otherwise swallow a
    cancellation that arrives as a write completes on Python 3.11, and the scheduler cancels
    tasks that may be talking to Redis (lease renewals, skew checks) when a run ends and on
    stop. The inner task is cancelled too; if it finishes its command anyway, no harm done:
    every script is safe to have run once more or less from a caller that went away.
    """
    task = asyncio.ensure_future(aw)
    task.add_done_callback(_retrieve)
    try:
        async with asyncio.timeout(timeout_s):
            return await asyncio.shield(task)
    except BaseException as exc:
        failed_inside = task.done()
        if not failed_inside:
            task.cancel()
        if isinstance(exc, asyncio.CancelledError | AnarchonError):
            raise
        if not failed_inside and isinstance(exc, TimeoutError):
            raise BackendUnavailable(f"Redis {where}: no answer within {timeout_s:g} s") from None
        if is_driver_error(exc):
            raise translate(exc, where) from exc
        raise


def _retrieve(task: asyncio.Future[Any]) -> None:
    # The caller may be gone (cancelled, timed out): mark the outcome seen, it is translated
    # above when anybody still waits for it.
    if not task.cancelled():
        task.exception()
