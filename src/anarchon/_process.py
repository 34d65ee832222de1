"""The process around a scheduler: :meth:`~anarchon.Scheduler.run` (an event loop of its own,
left without waiting for ever on handlers that ignore their cancellation) and
:meth:`~anarchon.Scheduler.serve` (start, wait for SIGINT/SIGTERM, stop).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Final

from ._supervisor import cancel_and_wait, wait_unless
from .errors import SchedulerStateError
from .logs import Action, log_fields

__all__ = ["EXIT_WAIT_S", "check_main_thread", "run", "serve"]

logger = logging.getLogger("anarchon.scheduler")

# run(): after stop(), tasks still running (ignoring their cancellation) get this long (s).
EXIT_WAIT_S: Final = 2.0


def run(
    serve: Callable[[], Coroutine[Any, Any, None]],
    stopping: Callable[[], asyncio.Task[None] | None],
    lingering: Callable[[], asyncio.Future[None] | None],
    stubborn: Callable[[], list[asyncio.Task[Any]]],
) -> None:
    """Run ``serve()`` on an event loop of its own, then leave it: interrupted, ``serve()``
    and the stop's task (``stopping()``) are cancelled; ``lingering()`` (the wait for handlers
    that ignore their cancellation, after stop) gets :data:`EXIT_WAIT_S`, the ``stubborn()``
    handlers still running are logged and left to end with the process, every other task is
    cancelled (waited for up to :data:`EXIT_WAIT_S`)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        raise SchedulerStateError(
            "Scheduler.run() blocks and cannot be called inside a running event loop; "
            "in async code use 'async with scheduler: ...' or 'await scheduler.serve()'"
        )
    check_main_thread()
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    main = loop.create_task(serve())
    try:
        loop.run_until_complete(main)
    finally:
        try:
            # Interrupted: KeyboardInterrupt before serve() took SIGINT, or a third signal.
            interrupted = not main.done()
            if interrupted:
                # serve() awaits the stop shielded: the interruption cuts the stop itself short
                # (what is left is bounded: let it finish).
                ending = [main]
                stop = stopping()
                if stop is not None:
                    stop.cancel()
                    ending.append(stop)
                main.cancel()
                loop.run_until_complete(asyncio.wait(ending))
            # Runs whose handlers ignored their cancellation keep their leases while the
            # process lives: a handler that ends within EXIT_WAIT_S has its result recorded
            # (cancelling it again would only cut that short). Then the process exits: a
            # handler still going ends with it, unreleased; its lease expires.
            waiting = lingering()
            if waiting is not None and not waiting.done():
                loop.run_until_complete(asyncio.wait([waiting], timeout=EXIT_WAIT_S))
            # Cancelling them again would only hurry them to an end whose result could not
            # be recorded any more: they are left as they are and end with the process.
            left_running = stubborn()
            spared = {*left_running, waiting}
            if left_running:
                logger.warning(
                    "%s: exiting with %d handler(s) still running; their runs are not handed "
                    "over: a backup takes each over when its lease expires",
                    "interrupted while stopping" if interrupted else "they ignore cancellation",
                    len(left_running),
                    extra=log_fields(Action.LEFT_TO_EXPIRE),
                )
            # asyncio.run() would wait for every task to accept its cancellation, for ever.
            left = [t for t in asyncio.all_tasks(loop) if not t.done() and t not in spared]
            loop.run_until_complete(cancel_and_wait(left, EXIT_WAIT_S))
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(
                asyncio.wait([loop.create_task(loop.shutdown_default_executor())], timeout=1)
            )
        finally:
            asyncio.set_event_loop(None)
            loop.close()


def check_main_thread() -> None:
    """Raise :class:`SchedulerStateError` outside the main thread: ``run()`` stops on SIGINT
    and SIGTERM, whose handlers only the main thread can install; elsewhere nothing could stop
    it (before, it ran on, deaf to both, and the process could not exit)."""
    thread = threading.current_thread()
    if thread is not threading.main_thread():
        raise SchedulerStateError(
            f"Scheduler.run() was called from thread {thread.name!r}: it stops on SIGINT and "
            "SIGTERM, whose handlers only the main thread can install, so nothing could stop "
            "it there. Call run() from the main thread, or in this thread run "
            "'asyncio.run(scheduler.serve(stop))' with an asyncio.Event 'stop' made in that "
            "loop, and stop it from another thread with 'loop.call_soon_threadsafe(stop.set)'"
        )


async def serve(
    start: Callable[[], Awaitable[None]],
    stop: Callable[[], Awaitable[None]],
    stop_event: asyncio.Event | None,
    hurry: Callable[[], None] | None = None,
) -> None:
    """``start()``, wait for SIGINT/SIGTERM (or ``stop_event``), ``stop()``; the signal
    handlers are installed only meanwhile, and only on the main thread.

    The signal is logged (``signal``). While ``stop()`` drains, a second SIGINT or SIGTERM
    calls ``hurry()`` (the grace period ends: running handlers are cancelled and handed over
    now; ``grace_cut_short``) and gives both signals back to their default actions, so a third
    one is not caught.
    """
    event = stop_event or asyncio.Event()
    loop = asyncio.get_running_loop()
    installed: list[signal.Signals] = []

    def release() -> None:
        while installed:
            loop.remove_signal_handler(installed.pop())

    def again(sig: signal.Signals) -> None:
        release()
        logger.warning(
            "%s while stopping: the grace period ends now; running handlers are cancelled and "
            "handed over. A third signal is not caught",
            sig.name,
            extra=log_fields(Action.GRACE_CUT_SHORT, signal=sig.name),
        )
        if hurry is not None:
            hurry()

    def first(sig: signal.Signals) -> None:
        if event.is_set():  # a second signal before the stop took over these handlers
            again(sig)
            return
        logger.info(
            "%s: stopping; running handlers may finish within the grace period (a second "
            "SIGINT or SIGTERM ends it at once)",
            sig.name,
            extra=log_fields(Action.SIGNAL, signal=sig.name),
        )
        event.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, first, sig)
            installed.append(sig)
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread
            pass
    try:
        started = await _start_unless_stopped(start, event)
    except BaseException:
        release()  # not started (or refused): nothing to stop
        raise
    if not started:
        try:
            await stop()  # a scheduler whose start was cancelled stops as one never started
        finally:
            release()
        logger.warning(
            "stopped while starting: the start was cancelled and the scheduler never started "
            "(nothing claimed; what the start had opened is closed)",
            extra=log_fields(Action.START_CANCELLED),
        )
        return
    try:
        await event.wait()
    finally:
        for sig in installed:
            loop.add_signal_handler(sig, again, sig)
        try:
            await stop()
        finally:
            release()


async def _start_unless_stopped(
    start: Callable[[], Awaitable[None]], stopped: asyncio.Event
) -> bool:
    """``start()``, cancelled if ``stopped`` is set first (a signal while the start waits on a
    backend that does not answer: before, the stop waited for the start to end, up to the
    backend's connect timeout). True once it started; False if the cancellation took (the
    start undid what it had begun: nothing left claiming, registered or open). The start's
    own error is raised."""
    starting = asyncio.ensure_future(start())
    try:
        await wait_unless(starting, stopped.wait())
    finally:
        if not starting.done():
            starting.cancel()
            # Its clean-up runs now (bounded: see Scheduler.stop's steps). A cancellation of
            # this wait itself (a third signal) leaves it to run.loop's end.
            await asyncio.wait({starting})
    if starting.cancelled():
        return False
    starting.result()  # the start's own error
    return True
