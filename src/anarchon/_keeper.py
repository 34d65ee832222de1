"""The lease keeper: renews the lease of every running attempt, in batches, from one task; and the
scheduler's own thread it runs on, out of the handlers' reach.

A handler that blocks the event loop (a blocking call in ``async def``) would starve a keeper
that shares the loop: the lease would expire and a backup would run the slot a second time while
the first run is still going. So, when the backend can give a second connection
(:meth:`~anarchon.backend.LeaseBackend.clone`) and the clock is the system clock, the keeper runs
on a thread of the scheduler's own with its own event loop and its own backend connection. The
same thread watches the main loop (:class:`~anarchon._watchdog.LoopWatchdog`).

Cross-thread traffic goes through :class:`Mailbox`: one wake-up of the target loop per batch of
calls, never one per call (each ``call_soon_threadsafe`` writes a byte to the loop's self-pipe;
thousands at once fill it and drop the byte that delivers SIGTERM, see the CHANGELOG of 0.1).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Final

from ._batch import isolate
from ._clock import Clock, sleep_or_wake
from ._supervisor import cancel_and_wait, consume, supervised, wait_unless
from .backend import LEASE_LOST, Backend, LeaseBackend, Ticket
from .errors import LeaseLost
from .logs import Action, log_fields

if TYPE_CHECKING:
    from ._active import ActiveRun
    from ._watchdog import LoopWatchdog

__all__ = ["KeeperThread", "LeaseKeeper", "Mailbox", "start_keeper"]

logger = logging.getLogger("anarchon.scheduler")

RENEWAL_HUNG = "the renewal call hung"
# The keeper woke this much (ms) after a renewal was due, past the lease's local deadline: the
# process was not running (SIGSTOP, a VM paused) or not scheduled (an overloaded host).
FROZEN_MIN_MS: Final = 1_000


def frozen_reason(late_ms: int) -> str:
    """Why a lease was lost when the keeper woke ``late_ms`` after its renewal was due."""
    return (
        f"this process was frozen or starved for {late_ms} ms: the renewal was due that long "
        "before the lease keeper could run, past the lease's local deadline"
    )


# While renewals fail, retry at least this often (ms) until the lease is over.
RENEW_RETRY_MS: Final = 1_000
# How long start() waits for the keeper thread's backend connection before keeping leases on
# the event loop instead.
THREAD_START_S: Final = 15.0
THREAD_STOP_S: Final = 10.0
# At most this many calls wait in a mailbox for the loop to take them (what they hold stays
# alive meanwhile: the garbage collector's work grows with it); one more wakes the loop.
MAILBOX_LAZY_MAX: Final = 256
# A post_by time no wake-up is needed for (ms on the monotonic clock, about 285 000 years).
_NOT_URGENT: Final = 2**63 - 1


class Mailbox:
    """Run calls posted from any thread on one event loop, in order, with one wake-up per batch."""

    def __init__(self, loop: asyncio.AbstractEventLoop, thread: int) -> None:
        self._loop = loop
        self._thread = thread
        self._lock = threading.Lock()
        self._items: deque[tuple[Callable[..., None], tuple[Any, ...]]] = deque()
        self._scheduled = False
        # The loop takes its items (:meth:`take`) by this time anyway (its clock's ms), so a
        # call needed no sooner waits for it instead of waking the loop (:meth:`post_by`).
        self._taken_by = 0

    @classmethod
    def here(cls) -> Mailbox:
        """A mailbox for the running loop (call on its thread)."""
        return cls(asyncio.get_running_loop(), threading.get_ident())

    def post(self, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn(*args)`` on the loop soon; from any thread. Dropped if the loop is closed."""
        self.post_by(0, fn, *args)

    def post_by(self, by_ms: int, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn(*args)`` on the loop by ``by_ms`` (the loop's clock) at the latest; from
        any thread. The loop is woken only if it would not take its items by then anyway, or
        :data:`MAILBOX_LAZY_MAX` calls wait (a burst of runs wakes the lease keeper's thread
        once per that many, not once per loop iteration of the poster)."""
        with self._lock:
            self._items.append((fn, args))
            if self._scheduled or (
                0 < self._taken_by <= by_ms and len(self._items) < MAILBOX_LAZY_MAX
            ):
                return
            self._scheduled = True
        try:
            if threading.get_ident() == self._thread:
                self._loop.call_soon(self._drain)
            else:
                self._loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # the loop is closed: nobody is left to run it
            with self._lock:
                self._items.clear()
                self._scheduled = False

    def take(self, by_ms: int) -> bool:
        """On the loop, before it waits: run the calls posted so far; if there were none, note
        that the loop takes its items again by ``by_ms`` (it wakes by then), and return False.
        The loop must then call :meth:`take` before it waits again."""
        with self._lock:
            items = list(self._items)
            self._items.clear()
            self._taken_by = 0 if items else by_ms
        self._run(items)
        return bool(items)

    def _drain(self) -> None:
        with self._lock:
            items = list(self._items)
            self._items.clear()
            self._scheduled = False
        self._run(items)

    @staticmethod
    def _run(items: list[tuple[Callable[..., None], tuple[Any, ...]]]) -> None:
        for fn, args in items:
            try:
                fn(*args)
            except Exception:
                logger.exception(
                    "a cross-thread call failed", extra=log_fields(Action.INTERNAL_ERROR)
                )


class LeaseKeeper:
    """Renews the leases of every running attempt, in batches, from one task.

    Each lease is renewed when two thirds of it are left (a third of its length after it was
    taken), so two renewals can fail before it expires. Renewals that fall due together go to the
    backend in one ``renew_many`` call. All times are on the monotonic clock: a wall-clock step
    neither delays a renewal nor sends one early.

    :meth:`add` and :meth:`discard` may be called from any thread; everything else runs on the
    keeper's own loop (:meth:`run`). ``on_lost(active, reason)`` is called on that loop.
    """

    def __init__(
        self,
        backend: LeaseBackend,
        clock: Clock,
        on_lost: Callable[[ActiveRun, str], None],
    ) -> None:
        self._backend = backend
        self._clock = clock
        self._on_lost = on_lost
        self._heap: list[tuple[int, int, ActiveRun]] = []
        self._seq = 0
        self._live: set[ActiveRun] = set()
        self._wake = asyncio.Event()
        self._inbox: Mailbox | None = None
        # Runs to start and stop keeping, queued from any thread and taken by the keeper in one
        # call (:meth:`_take`): a burst of runs costs no object per run on the way (a mailbox
        # call of its own per run made three, alive until the keeper woke).
        self._queue_lock = threading.Lock()
        self._adding: list[ActiveRun] = []
        self._dropping: list[ActiveRun] = []
        # The time (the keeper's clock) by which a posted _take runs; 0: none is posted.
        self._take_by = 0

    def bind(self) -> None:
        """Attach to the running loop (the one :meth:`run` will run on)."""
        self._inbox = Mailbox.here()
        self._wake = asyncio.Event()

    def add(self, active: ActiveRun) -> None:
        """Keep ``active``'s lease from now on (its ``deadline`` set by the caller)."""
        active.kept = True
        assert self._inbox is not None, "the lease keeper is not running"
        # Needed by the keeper by the lease's first renewal (see _add), no sooner.
        third = active.ticket.lease_ms // 3
        first = max(min(self._clock.monotonic_ms() + third, active.deadline - 2 * third), 1)
        with self._queue_lock:
            self._adding.append(active)
            if 0 < self._take_by <= first:
                return  # taken by then anyway
            self._take_by = first
        self._inbox.post_by(first, self._take)

    def discard(self, active: ActiveRun) -> None:
        """Stop renewing ``active`` (it finished, or is being handed over). Takes effect at once:
        a renewal in flight is not applied."""
        active.kept = False
        if self._inbox is None:
            return
        with self._queue_lock:
            self._dropping.append(active)
            if self._take_by:
                return
            # Never urgent (a run no longer kept is not renewed): taken when the keeper wakes.
            self._take_by = _NOT_URGENT
        self._inbox.post_by(_NOT_URGENT, self._take)

    def __len__(self) -> int:
        return len(self._live)

    def _take(self) -> None:
        """On the keeper's loop: start keeping the runs added, stop keeping those discarded."""
        with self._queue_lock:
            adding, self._adding = self._adding, []
            dropping, self._dropping = self._dropping, []
            self._take_by = 0
        for active in adding:
            self._add(active)
        for active in dropping:
            self._live.discard(active)

    def _add(self, active: ActiveRun) -> None:
        if not active.kept:
            return
        self._live.add(active)
        ticket = active.ticket
        # The first renewal when two thirds of the lease are left: a third of a lease from now
        # for a fresh lease, sooner for one that was partly used (a retried claim).
        third = ticket.lease_ms // 3
        now = self._clock.monotonic_ms()
        self._push(active, max(now, min(now + third, active.deadline - 2 * third)))

    def _push(self, active: ActiveRun, at: int) -> None:
        self._seq += 1
        active.renew_at = at
        heapq.heappush(self._heap, (at, self._seq, active))
        if self._heap[0][2] is active:
            self._wake.set()

    async def run(self) -> None:
        """Renew leases as they fall due, until cancelled."""
        while True:
            now = self._clock.monotonic_ms()
            due: list[ActiveRun] = []
            first_due = now
            while self._heap and self._heap[0][0] <= now:
                at, _, active = heapq.heappop(self._heap)
                if active in self._live and active.kept and active.renew_at == at:
                    due.append(active)
                    first_due = min(first_due, at)
            if due:
                await self._renew(due, now - first_due)
                continue
            delay = min((self._heap[0][0] - now) / 1000 if self._heap else 30.0, 30.0)
            assert self._inbox is not None
            if self._inbox.take(max(now + int(delay * 1000), 1)):
                continue  # adds taken: the heap may have changed
            self._wake.clear()
            await sleep_or_wake(self._clock.sleep(delay), self._wake)

    async def _renew(self, due: list[ActiveRun], late_ms: int = 0) -> None:
        """Renew ``due``; ``late_ms``: how long after the first of them was due the keeper
        woke to do it (the process was frozen or starved meanwhile, when that is long)."""
        sent = self._clock.monotonic_ms()
        error: Exception | None = None
        answers: list[Ticket | LeaseLost | Exception] | None = None
        call = asyncio.ensure_future(self._renew_many([a.ticket for a in due]))
        # A call that hangs (a link that holds packets) must not keep a lease alive past its
        # local deadline: at the first deadline of the batch the call is given up and the
        # overdue leases are lost (their handlers told and cancelled), the others retried.
        first_deadline = min(a.deadline for a in due)
        expiry = self._clock.sleep(max(0, first_deadline - sent) / 1000)
        if not await wait_unless(call, expiry):
            call.cancel()
            call.add_done_callback(consume)
            why = RENEWAL_HUNG
            if first_deadline <= sent and late_ms >= FROZEN_MIN_MS:
                # The deadline had passed before the call was sent: it did not hang.
                why = frozen_reason(late_ms)
            error = TimeoutError(f"no answer before the lease's local deadline ({why})")
        else:
            try:
                answers = call.result()
            except Exception as exc:  # BackendUnavailable: every lease of the batch waits
                error = exc
        now = self._clock.monotonic_ms()
        warned = False
        for n, active in enumerate(due):
            if active not in self._live or not active.kept:
                continue
            answer = answers[n] if answers is not None else error
            if isinstance(answer, Ticket):
                active.ticket = answer
                active.set_deadline(_local_expiry(sent, answer))
                self._push(active, now + answer.lease_ms // 3)
            elif isinstance(answer, LeaseLost):
                self._lose(active, f"{LEASE_LOST}: {answer}")
            elif now >= active.deadline:
                self._lose(active, f"{LEASE_LOST}: could not renew before expiry ({answer})")
            else:
                if not warned:
                    warned = True
                    logger.warning(
                        "renewing %d lease(s) failed, retrying: %s",
                        len(due),
                        answer,
                        extra=log_fields(Action.RENEW_FAILED, ticket=active.ticket),
                    )
                self._push(active, now + min(RENEW_RETRY_MS, active.ticket.lease_ms // 3))

    async def _renew_many(self, tickets: list[Ticket]) -> list[Ticket | LeaseLost | Exception]:
        return list(
            await isolate(self._backend.renew_many, tickets, lambda t: t.job, "renewing the lease")
        )

    def _lose(self, active: ActiveRun, reason: str) -> None:
        self._live.discard(active)
        active.kept = False
        self._on_lost(active, reason)


def _local_expiry(local_sent_ms: int, ticket: Ticket) -> int:
    """When the lease surely ends, on the local monotonic clock: the time the call was sent
    plus what the backend said was left (an earlier bound than the answer's arrival)."""
    if ticket.lease_expires_at_ms is None or ticket.backend_now_ms is None:
        return local_sent_ms + ticket.lease_ms
    return local_sent_ms + (ticket.lease_expires_at_ms - ticket.backend_now_ms)


class KeeperThread:
    """A thread of the scheduler's own, with its own event loop, that hosts the loop watchdog and,
    when given a backend of its own, the lease keeper.

    ``start()`` returns once the thread's backend has started (or failed to: then the keeper is
    not hosted and the caller keeps leases on its own loop). ``stop()`` stops the keeper, closes
    the thread's backend and ends the thread, within :data:`THREAD_STOP_S`; a thread that does
    not end by then is abandoned (it is a daemon thread).
    """

    def __init__(
        self,
        clock: Clock,
        watchdog: LoopWatchdog | None,
        backend: LeaseBackend | None,
        make_keeper: Callable[[LeaseBackend], LeaseKeeper],
    ) -> None:
        self._clock = clock
        self._watchdog = watchdog
        self._backend = backend
        self._make_keeper = make_keeper
        self.keeper: LeaseKeeper | None = None
        self._ready: Future[bool] = Future()
        self._ended: Future[None] = Future()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None

    @property
    def alive(self) -> bool:
        """Whether the keeper's thread runs (started, not ended)."""
        thread = self._thread
        return thread is not None and thread.is_alive()

    async def start(self) -> bool:
        """Start the thread; True if it keeps leases (its backend started)."""
        self._thread = threading.Thread(target=self._main, name="anarchon-keeper", daemon=True)
        self._thread.start()
        try:
            return await asyncio.wait_for(asyncio.wrap_future(self._ready), THREAD_START_S)
        except TimeoutError:
            logger.warning(
                "the lease keeper's own connection did not start within %.0f s; leases are "
                "kept on the event loop instead",
                THREAD_START_S,
                extra=log_fields(Action.KEEPER_THREAD),
            )
            await self.stop()
            return False

    def _main(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # never let the thread die without a word
            logger.error(
                "the lease keeper thread failed", exc_info=exc, extra=log_fields(Action.KEEPER)
            )
        finally:
            if not self._ready.done():
                self._ready.set_result(False)
            self._ended.set_result(None)

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        tasks: list[asyncio.Future[None]] = []
        if self._watchdog is not None:
            tasks.append(asyncio.ensure_future(supervised("watchdog", self._watchdog.run)))
        backend, keeper = self._backend, None
        if backend is not None:
            try:
                await backend.start()
            except Exception as exc:
                logger.warning(
                    "the lease keeper's own connection could not start (%s); leases are kept "
                    "on the event loop instead",
                    exc,
                    extra=log_fields(Action.KEEPER_THREAD),
                )
                backend = None
            else:
                keeper = self._make_keeper(backend)
                keeper.bind()
                self.keeper = keeper
                tasks.append(asyncio.ensure_future(supervised("lease keeper", keeper.run)))
        if not self._ready.done():
            self._ready.set_result(keeper is not None)
        try:
            await self._stop.wait()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if backend is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(backend.stop(), THREAD_STOP_S / 2)

    async def stop(self) -> None:
        """Stop the keeper and the watchdog, close the thread's backend, end the thread."""
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None:
            with contextlib.suppress(RuntimeError):  # already closed
                loop.call_soon_threadsafe(stop.set)
        if self._thread is None:
            return
        try:
            # Shielded: a stop cancelled (or timed out) must not cancel the thread's future,
            # which the thread then could not set (InvalidStateError, a traceback at exit).
            ended = asyncio.shield(asyncio.wrap_future(self._ended))
            await asyncio.wait_for(ended, THREAD_STOP_S)
        except TimeoutError:
            logger.warning(
                "the lease keeper thread did not end within %.0f s; abandoned",
                THREAD_STOP_S,
                extra=log_fields(Action.KEEPER_THREAD),
            )


async def start_keeper(
    stack: contextlib.AsyncExitStack,
    backend: Backend,
    clock: Clock,
    watchdog: LoopWatchdog | None,
    make_keeper: Callable[[LeaseBackend], LeaseKeeper],
    loop_task: Callable[[str, Callable[[], Any]], asyncio.Future[None]],
) -> tuple[LeaseKeeper | None, KeeperThread | None]:
    """Start the lease keeper, its clean-up registered on ``stack``; return it (None if the
    backend keeps no leases) and its thread.

    Given a ``watchdog`` (the scheduler runs on the system clock), a :class:`KeeperThread` hosts
    it and, when the backend can give a connection of its own, the keeper; else the keeper runs
    on this loop, as the supervised task ``loop_task`` starts.
    """
    threaded = watchdog is not None
    clone: LeaseBackend | None = None
    if threaded and isinstance(backend, LeaseBackend):
        try:
            clone = backend.clone()
        except Exception as exc:
            logger.warning(
                "%s could not give the lease keeper a connection of its own (%s); leases "
                "are kept on the event loop",
                backend.name,
                exc,
                extra=log_fields(Action.KEEPER_THREAD),
            )
    keeper: LeaseKeeper | None = None
    host: KeeperThread | None = None
    if threaded:
        host = KeeperThread(clock, watchdog, clone, make_keeper)
        stack.push_async_callback(host.stop)
        if await host.start():
            keeper = host.keeper
    if keeper is None and isinstance(backend, LeaseBackend):
        keeper = make_keeper(backend)
        keeper.bind()
        task = loop_task("lease keeper", keeper.run)
        stack.push_async_callback(cancel_and_wait, [task])
        if threaded:
            logger.info(
                "leases of %s are kept on the event loop (the backend gave no connection "
                "of its own): a handler that blocks the loop can cost its lease",
                backend.name,
                extra=log_fields(Action.KEEPER_THREAD),
            )
    return keeper, host
