"""The scheduler's services: its parts, built from its options, started in order and stopped
in reverse.

:class:`Services` builds the parts a slot goes through (the map is :mod:`._scheduler`'s) and
links them: the backend's clock (:mod:`._clock`), the handler threads (:mod:`._threads`), the
rank delays (:mod:`._rendezvous`), the runner (:mod:`._runner`), on a lease backend the backup
watcher (:mod:`._watcher`), the claims (:mod:`._claims`), catching up (:mod:`._catchup`) and
backlogs (:mod:`._backlog`), the firing (:mod:`._firing`) and the failures' hooks
(:mod:`._retrying`). It starts them in two steps of :meth:`Scheduler.start
<anarchon.Scheduler.start>`, each service registering its clean-up as it starts on one of the
start's two exit stacks: ``base`` (the backend, the handler threads, the loops' group, the lease
keeper), undone last, and ``stack`` (the rest), undone first, so the stop runs in the reverse of
the start:

* :meth:`Services.prepare`, before the scheduler runs: the instance named, the backend's stop
  and the handler threads' end registered, the loops' group (:mod:`._loops`) entered;
* :meth:`Services.start`, once it runs: the lease keeper (:mod:`._keeper`) and the loop
  watchdog (:mod:`._watchdog`); the drain and the claims' settling, registered now so they run
  after everything below has stopped; the watcher and its adoption loop; the claims other
  instances win (:mod:`._rendezvous`); the timer and the clock's watch, from the backend's clock
  measured first; catching up the jobs carried; the run requests (:mod:`._requests`) and the
  heartbeat (:mod:`._heartbeat`), where the backend has them; last, the guard, which stops the
  scheduler if the event loop ends under it.

It owns what the parts call back into: the short tasks they spawn, the keeper's lost leases, a
backup's takeovers and their last failures, the backend's notices, and the watchdog's question
of what blocks the loop.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AsyncExitStack
from types import FrameType
from typing import Any, Final

from ._active import ActiveRun
from ._backlog import Backlogs
from ._catchup import CatchingUp
from ._claims import Claims
from ._clock import BackendClock, Clock, SystemClock
from ._firing import Firing
from ._heartbeat import Heartbeat
from ._job import Job
from ._keeper import KeeperThread, LeaseKeeper, Mailbox, start_keeper
from ._loops import Loops
from ._metrics import Counters
from ._missed import MissedSlots
from ._models import Run
from ._rendezvous import Rendezvous
from ._requests import RequestPoller
from ._retrying import Failures
from ._runner import RunExecutor
from ._supervisor import cancel_and_wait
from ._threads import HandlerThreads
from ._watchdog import LoopWatchdog, describe_blocker
from ._watcher import ADOPT_EVERY_MS, BackupWatcher
from .backend import Backend, ClaimNotice, LeaseBackend, Ticket
from .logs import Action, bind_instance, log_fields

__all__ = ["Services"]

logger = logging.getLogger("anarchon.scheduler")

# On stop, claims and takeovers already sent get this long to come back (s).
SETTLE_S: Final = 5.0


class Services:
    """One scheduler's parts and the services that run them (see the module's docstring).

    :param backend: the scheduler's backend.
    :param clock: the scheduler's clock.
    :param jobs: the scheduler's registered jobs (the same dict: added and removed jobs show).
    :param counters: the scheduler's counters.
    :param max_workers: the handler threads.
    :param grace_ms: how long the stop lets runs finish.
    :param heartbeat_ms: the heartbeat's period.
    :param control_poll_ms: how often the run requests are read.
    :param running: whether the scheduler runs (:attr:`Scheduler.running`).
    :param jobs_version: the count of the scheduler's job additions and removals.
    :param stop_began: when the scheduler's stop began (monotonic ms).
    :param stop: the scheduler's :meth:`~anarchon.Scheduler.stop` (the guard calls it).
    """

    def __init__(
        self,
        backend: Backend,
        clock: Clock,
        jobs: dict[str, Job],
        counters: Counters,
        *,
        max_workers: int,
        grace_ms: int,
        heartbeat_ms: int,
        control_poll_ms: int,
        running: Callable[[], bool],
        jobs_version: Callable[[], int],
        stop_began: Callable[[], int],
        stop: Callable[[], Awaitable[None]],
    ) -> None:
        self._backend = backend
        self._clock = clock
        self._jobs = jobs
        self._counters = counters
        self._grace_ms = grace_ms
        self._heartbeat_ms = heartbeat_ms
        self._control_poll_ms = control_poll_ms
        self._running = running
        self._jobs_version = jobs_version
        self._stop_began = stop_began
        self._stop = stop
        self._instance = ""  # named by prepare()
        self.backend_clock = BackendClock(backend, clock, jobs, counters)
        self.threads = HandlerThreads(max_workers)
        self.rendezvous = Rendezvous("", clock.monotonic_ms)
        self.executor = RunExecutor(backend, clock, self.threads, counters, grace_ms)
        self.watcher: BackupWatcher | None = None
        if isinstance(backend, LeaseBackend):
            self.watcher = BackupWatcher(
                backend, clock, "", jobs.get, self._on_taken, counters, self.threads
            )
        self.claims = Claims(
            backend,
            clock,
            self.backend_clock.time,
            jobs,
            self.executor,
            self.watcher,
            self.threads,
            counters,
            running,
            self.spawn,
        )
        self.catching_up = CatchingUp(
            backend,
            clock,
            self.claims,
            self.threads,
            running,
            self.spawn,
            MissedSlots(backend, self.claims, counters, clock),
        )
        # A backlog (the process was frozen) is decided as catch-up decides missed slots.
        backlogs = Backlogs(
            backend,
            clock,
            self.claims,
            self.threads,
            self.catching_up.backlog,
            lambda: self.watchdog,
            self.spawn,
        )
        self.firing = Firing(
            jobs,
            running,
            self.rendezvous,
            clock,
            self.backend_clock,
            backend,
            self.claims,
            self.threads,
            counters,
            self.spawn,
            backlogs,
        )
        self.failures = Failures(backend.control(), self.backend_clock.time, counters)
        self.executor.failures = self.failures
        if self.watcher is not None:
            self.watcher.on_exhausted = self._on_exhausted
            follow = self.watcher.follow
            self.executor.results.on_refused = lambda ticket: follow(ticket.job, ticket.slot_key)
        #: The short tasks the parts spawn (claims, catch-up, takeovers' hooks).
        self.tasks: set[asyncio.Future[Any]] = set()
        self.loops = Loops(clock.sleep)  # the long-lived loops' task group
        self.heartbeat: Heartbeat | None = None
        self.keeper_thread: KeeperThread | None = None
        self.watchdog: LoopWatchdog | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.mailbox: Mailbox | None = None  # posts to the event loop from other threads
        self._loop_ended = False  # the event loop ended under the running scheduler (_guard)

    # -- start ------------------------------------------------------------------------------

    async def prepare(self, base: AsyncExitStack, instance_id: str) -> None:
        """Before the scheduler runs: name the instance, register the backend's stop and the
        handler threads' end on ``base``, and enter the loops' group (see :mod:`._loops`: it is
        left once every loop has stopped). Entering waits for its owner task: done before the
        scheduler runs, so no start is seen running for that wait."""
        self._instance = instance_id
        self.claims.instance = self.backend_clock.instance = instance_id
        bind_instance(instance_id)
        base.push_async_callback(self._backend.stop)
        self.loop = asyncio.get_running_loop()
        self.mailbox = Mailbox.here()
        base.callback(self._abandon_threads)
        await base.enter_async_context(self.loops)

    async def start(self, base: AsyncExitStack, stack: AsyncExitStack) -> None:
        """Once the scheduler runs: start every service in order, the lease keeper's clean-up
        on ``base``, the others' on ``stack``."""
        loop = self.loop
        assert loop is not None  # set by prepare()
        self.backend_clock.time.assume_local()
        await self._start_keeper(base, loop)
        # Runs drain (grace, then hand-over) while the keeper still renews their leases.
        stack.push_async_callback(self._drain)
        stack.push_async_callback(self._settle_claims)
        if self.watcher is not None:
            await self._start_watcher(self.watcher, stack)
        await self._subscribe_claims()
        stack.callback(self.rendezvous.forget)
        # The jobs are carried from now by the backend's clock, measured first: the timer
        # fires the slots after it, catch-up (and its rules) decides on those before. On this
        # host's clock, an instance behind would claim, late, slots due before it (or the
        # fleet) started, and one ahead would pass over the slots up to its own time.
        await self.backend_clock.measure_at_start()
        now = self.backend_clock.time.now_ms()
        self.firing.schedule_all(list(self._jobs.values()), now)
        timer = self.loops.start("timer", self.firing.timer.run)
        skew = self.loops.start("clock", self.backend_clock.watch)
        stack.push_async_callback(cancel_and_wait, [timer, skew])
        self._carry(list(self._jobs.values()), now)
        self._start_requests(stack)
        self._start_heartbeat(stack)
        # Last, so a stop ends it first (it then does nothing), unless the stop is its own.
        guard = loop.create_task(self._guard(), name=f"anarchon guard of {self._instance}")
        stack.push_async_callback(self._end_guard, guard)

    def _carry(self, jobs: list[Job], now: int) -> None:
        """What beginning to carry ``jobs`` (on start, on ``add()`` while running) sets going
        beside their timers, all from ``now``, the backend's clock (estimated) when this
        instance began carrying them: catching up their missed slots (up to ``now``; the timer
        fires those after it), and on a lease backend watching their runs still open from
        before (``BackupWatcher.adopt``)."""
        self.spawn(self.catching_up.start(jobs, now))
        if self.watcher is not None:
            self.spawn(self.watcher.adopt(jobs, now))

    def carry_added(self, job: Job) -> None:
        """Carry ``job``, added while the scheduler runs: on the backend's clock, as at start,
        so a clock behind does not fire slots from before the job was added, and a clock ahead
        does not pass over the slots between."""
        now = self.backend_clock.time.now_ms()
        self.firing.schedule_next(job, now)
        self._carry([job], now)

    async def _start_keeper(self, base: AsyncExitStack, loop: asyncio.AbstractEventLoop) -> None:
        """Start the lease keeper (:func:`._keeper.start_keeper`): on the system clock, on a
        thread of the scheduler's own that also hosts the loop watchdog."""
        if type(self._clock) is SystemClock:
            self.watchdog = LoopWatchdog(
                loop, threading.get_ident(), self._clock.monotonic_ms, self._describe_blocker
            )
        keeper, self.keeper_thread = await start_keeper(
            base, self._backend, self._clock, self.watchdog, self._make_keeper, self.loops.start
        )
        self.executor.keeper = keeper
        self.executor.closed = False

    def _make_keeper(self, backend: LeaseBackend) -> LeaseKeeper:
        """The lease keeper of ``backend`` (the scheduler's, or a connection of its own)."""
        return LeaseKeeper(backend, self._clock, self._on_lease_lost)

    async def _start_watcher(self, watcher: BackupWatcher, stack: AsyncExitStack) -> None:
        """Hear the backend's hand-overs and results, and start the watcher's loop and the
        adoption's (:meth:`_adopt_again`)."""
        backend = self._backend
        assert isinstance(backend, LeaseBackend)
        watcher.instance = self._instance
        mailbox = self.mailbox
        assert mailbox is not None

        def poke(job: str, slot_key: str, released: bool = True) -> None:
            # From the backend's listener, possibly on another thread: one wake-up of the
            # loop per batch of notifications (see Mailbox). A result is not posted while
            # nothing is watched (every result of a burst this instance alone runs is
            # notified); a hand-over always is (the watcher checks it if it carries the job).
            if released or watcher.watching():
                mailbox.post(watcher.poke, job, slot_key, released)

        await backend.subscribe(poke)
        stack.push_async_callback(self._stop_watcher, self.loops.start("watcher", watcher.run))
        adopting = self.loops.start("adopt", self._adopt_again)
        stack.push_async_callback(cancel_and_wait, [adopting])

    async def _subscribe_claims(self) -> None:
        """Hear the claims other instances win (rank delays: see :mod:`._rendezvous`)."""
        rendezvous = self.rendezvous
        rendezvous.instance = self._instance
        mailbox = self.mailbox
        assert mailbox is not None

        mine = self._instance

        def on_claims(notices: Sequence[ClaimNotice]) -> None:
            # From the backend's listener, possibly on another thread: handled on the loop.
            # This instance's own wins are dropped here (the rendezvous would drop them too),
            # so a burst's notices do not stay alive, queued, while its runs are handed out.
            others = [notice for notice in notices if notice.instance != mine]
            if others:
                mailbox.post(self._on_claims, others)

        rendezvous.notices = await self._backend.subscribe_claims(on_claims)

    def _start_requests(self, stack: AsyncExitStack) -> None:
        """Where the backend has a control store: run the cluster's run requests (triggers and
        retries, see :mod:`._requests`)."""
        control = self._backend.control()
        if control is None:
            return
        poller = RequestPoller(
            control,
            self._clock,
            self.backend_clock.time,
            lambda: self._jobs,
            self.claims,
            self.threads,
            self._counters,
            self._control_poll_ms,
        )
        polling = self.loops.start("requests", poller.run)
        stack.push_async_callback(self._stop_poller, poller, polling)

    def _start_heartbeat(self, stack: AsyncExitStack) -> None:
        """Where the backend keeps a registry: record this instance and its jobs in it (see
        :mod:`._heartbeat`)."""
        store = self._backend.registry()
        if store is None:
            return
        jobs, offset = self._jobs.values, lambda: self.backend_clock.offset_ms
        beat = Heartbeat(
            store,
            self._clock,
            self._heartbeat_ms,
            self._instance,
            jobs,
            offset,
            self._jobs_version,
        )
        beat.on_view = self.rendezvous.see
        self.heartbeat = beat
        beat.start(self.loops.start)
        stack.push_async_callback(beat.stop)

    async def _guard(self) -> None:
        """Wait, doing nothing, until cancelled. Cancelled while the scheduler runs (no stop
        begun), the event loop is ending under it: ``asyncio.run()`` returned or raised with the
        scheduler still running, and cancels every task left, handlers' and the scheduler's
        own. Then stop now, the grace cut short (the handlers are cancelled already): their
        runs are handed over, this instance leaves the registry and the backend is closed,
        instead of leases and the instance's record left to expire. A plain handler's thread,
        which no cancellation stops, is waited for within the grace, its lease renewed and its
        result recorded (as a stop does). ``asyncio.run()`` waits for this task, so for the
        stop."""
        try:
            await asyncio.get_running_loop().create_future()
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if not self._running() or task is None:
                raise  # stop() ends it
            task.uncancel()
            self._loop_ended = True  # the stop must not cancel this task: asyncio.run() awaits it
            logger.warning(
                "scheduler %s: the event loop is ending while it runs (asyncio.run() returned "
                "or raised before 'await scheduler.stop()'), cancelling its handlers: stopping "
                "now, their runs handed over (plain handlers' threads still working are waited "
                "for up to grace_ms). Stop the scheduler before the loop ends: 'async with "
                "scheduler:' or 'await scheduler.stop()'",
                self._instance,
                extra=log_fields(Action.LOOP_ENDED),
            )
            self.executor.hurry()
            await self._stop()

    async def _end_guard(self, guard: asyncio.Task[None]) -> None:
        """Cancel the guard, unless the event loop's end woke it (it runs the stop)."""
        if not self._loop_ended:
            await cancel_and_wait([guard])

    # -- what the parts call back into ------------------------------------------------------

    def _on_claims(self, notices: Sequence[ClaimNotice]) -> None:
        """Other instances won slots this one waits on: watch those runs as a backup would
        (the claims themselves are dropped when the slots come due, see :mod:`._firing`)."""
        if not self._running():
            return
        now: int | None = None
        for notice in self.rendezvous.hear(notices):
            if self.watcher is None or notice.lease_expires_at_ms is None:
                continue
            if notice.job in self._jobs:
                now = self.backend_clock.time.now_ms() if now is None else now
                self.watcher.watch(notice.job, notice.slot_key, notice.lease_expires_at_ms, now)

    def _on_lease_lost(self, active: ActiveRun, reason: str) -> None:
        """From the keeper (maybe on its thread): flag the handler's context at once, then tell
        the executor on the event loop."""
        active.ctx._flag_lost(reason)
        if self.mailbox is not None:
            self.mailbox.post(self.executor.lose, active, reason)
            if self.watcher is not None:  # watch the slot: its newer attempt, or this one's end
                ticket = active.ticket
                self.mailbox.post(self.watcher.follow, ticket.job, ticket.slot_key)

    def _on_taken(self, job: Job, ticket: Ticket, reserved: bool, sent: int) -> None:
        """The watcher took over a run: run it here."""
        # Also while stopping: the run is then drained with the others, or handed over at once
        # if the grace period is over, instead of being left to expire.
        self.executor.start(job, ticket, reserved=reserved, sent_ms=sent)

    def _on_exhausted(self, job: Job, run: Run) -> None:
        """A backup's takeover recorded ``run`` failed on its last attempt: the slot finally
        failed here."""
        self.spawn(self.failures.finally_failed(job, run))

    async def _adopt_again(self) -> None:
        """Every :data:`~._watcher.ADOPT_EVERY_MS`, watch the carried jobs' open runs not
        watched yet (those this instance runs aside): a run whose lease ended is taken over
        even when no instance watched it (its runner lost its lease unseen)."""
        assert self.watcher is not None
        while True:
            await self._clock.sleep(ADOPT_EVERY_MS / 1000)
            if self._running() and self._jobs:
                now = self.backend_clock.time.now_ms()
                jobs = list(self._jobs.values())
                await self.watcher.adopt(jobs, now, skip=self.executor.active, quiet=True)

    def _describe_blocker(self, frame: FrameType | None) -> tuple[str, str | None]:
        """On the watchdog's thread: what blocks the loop (see :func:`describe_blocker`)."""
        loop = self.loop
        active = self.executor.running(asyncio.current_task(loop) if loop else None)
        return describe_blocker(frame, list(self._jobs.values()), active)

    # -- stop (the clean-ups, in the reverse of their registration) -------------------------

    async def _stop_poller(self, poller: RequestPoller, task: asyncio.Future[None]) -> None:
        """Stop the run requests' loop, letting requests already claimed settle."""
        await poller.stop(task, SETTLE_S)
        await cancel_and_wait([task])

    async def _stop_watcher(self, task: asyncio.Future[None]) -> None:
        """Stop the watcher's loop, letting a takeover in flight settle."""
        await cancel_and_wait([task])
        if self.watcher is not None:
            await self.watcher.close(SETTLE_S)

    async def _settle_claims(self) -> None:
        """Let claims already sent come back (bounded): a won slot is then run or handed over."""
        await self.claims.settle(SETTLE_S)
        await cancel_and_wait(list(self.tasks))

    async def _drain(self) -> None:
        """Let runs finish up to ``grace_ms`` after the stop began, then hand the rest over."""
        await self.executor.drain(self._stop_began() + self._grace_ms)

    def _abandon_threads(self) -> None:
        """Leave the handler threads still running (logged) and close the pool."""
        busy = self.threads.busy()
        if busy:
            logger.warning(
                "abandoning %d handler thread(s) still running after grace_ms=%d: %s. A thread "
                "cannot be stopped; these are daemon threads and end with the process",
                len(busy),
                self._grace_ms,
                "; ".join(busy),
                extra=log_fields(Action.THREADS_ABANDONED, threads=len(busy)),
            )
        self.threads.close()

    # -- tasks ------------------------------------------------------------------------------

    def spawn(self, coro: Any) -> None:
        """Run ``coro`` as one of the short tasks (settled on stop, its failure logged)."""
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.task_done)

    def task_done(self, task: asyncio.Future[Any]) -> None:
        """Forget a short task that ended and log its failure."""
        self.tasks.discard(task)
        if isinstance(task, asyncio.Task) and task.cancelling():
            return  # cancelled on stop: cancel_and_wait logs an error it ended by instead
        if not task.cancelled() and task.exception() is not None:
            logger.error(
                "internal task failed",
                exc_info=task.exception(),
                extra=log_fields(Action.INTERNAL_ERROR),
            )
