"""The scheduler: registers jobs, fires their slots, claims through the backend, runs winners.

Life cycle, declared once in :meth:`Scheduler.start` with an :class:`contextlib.AsyncExitStack`
(APScheduler 4's ``AsyncScheduler.__aenter__`` is the model): each service registers its own
clean-up as it starts, so :meth:`Scheduler.stop` undoes them in reverse order:

1. stop firing (the timer) and measuring the clock; stop backup takeovers (the watcher), letting
   a takeover in flight settle;
2. let claims in flight settle (bounded), so a won slot is run or handed over;
3. let handlers run up to ``grace_ms`` while the lease keeper still renews their leases; cancel
   what is left and hand it over (release);
4. stop the lease keeper (and its thread and connection), abandon handler threads still running
   (daemon threads: the process can exit), stop the backend.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import os
import random
import signal
import socket
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import replace
from enum import Enum
from types import CodeType, FrameType, TracebackType
from typing import Any, Final, TypeVar

from ._batch import isolate
from ._catchup import missed_slots
from ._clock import CLOCK_METHODS, BackendTime, Clock, SystemClock, sleep_or_wake
from ._heartbeat import DEFAULT_HEARTBEAT_MS, HEARTBEAT, Heartbeat, read_cluster
from ._job import Handler, Job, JobOptions, Timezone, build_job
from ._keeper import KeeperThread, LeaseKeeper, Mailbox
from ._models import CatchUp, Overlap, Run, RunStatus, Trigger
from ._options import Bound, check_int
from ._retry import backoff
from ._runner import ActiveRun, RunExecutor
from ._supervisor import supervised
from ._threads import HandlerThreads
from ._timer import Due, SlotTimer
from ._watchdog import LoopWatchdog
from ._watcher import BackupWatcher
from .backend import Backend, ClaimOutcome, ClaimRequest, ClaimStatus, LeaseBackend, Ticket
from .errors import (
    BackendUnavailable,
    DuplicateJob,
    InvalidOption,
    JobNotFound,
    SchedulerStateError,
    UnsupportedFeature,
)
from .registry import ClusterView

__all__ = ["Scheduler"]

logger = logging.getLogger("anarchon.scheduler")

H = TypeVar("H", bound=Handler)

DEFAULT_GRACE_MS: Final = 30_000
GRACE: Final = Bound(0, 24 * 3600 * 1000, ms=True)
DEFAULT_MAX_WORKERS: Final = 32
MAX_WORKERS: Final = Bound(1, 1024)
MAX_INSTANCE_ID: Final = 256
SKEW_CHECK_S: Final = 60.0
MANUAL_CLAIM_TIMEOUT_S: Final = 10.0
CATCH_UP_POLL_S: Final = 0.25
THREAD_POLL_S: Final = 0.05
# On stop, claims and takeovers already sent get this long to come back (s).
SETTLE_S: Final = 5.0
# run(): after stop(), tasks still running (ignoring their cancellation) get this long (s).
EXIT_WAIT_S: Final = 2.0
# A slot due by this host's wall clock but still this far (ms) in the future by the backend's
# (this clock is ahead: stepped, or a VM resumed) waits for the backend's time to reach it.
EARLY_TOLERANCE_MS: Final = 1_000
EARLY_RECHECK_MS: Final = 1_000


class _State(Enum):
    NEW = "new"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"


async def _cancel_and_wait(tasks: Sequence[asyncio.Future[Any]], limit_s: float = 5.0) -> None:
    """Cancel ``tasks`` and wait for them, cancelling again while any is left: a library that
    swallows a cancellation (some drivers' timeouts do) must not make stop() hang."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s
    pending = {t for t in tasks if not t.done()}
    while pending and loop.time() < deadline:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=0.25)
    if pending:
        names = ", ".join(sorted(t.get_name() for t in pending if isinstance(t, asyncio.Task)))
        logger.warning(
            "%d task(s) did not stop when cancelled (%s); left behind",
            len(pending),
            names,
            extra={"action": "stop"},
        )


def _new_id() -> str:
    """A random 128-bit id in hex, for run ids and tokens."""
    return os.urandom(16).hex()


def default_instance_id() -> str:
    """``<hostname>-<pid>-<4 hex>``: unique per process, readable in history. Computed when the
    scheduler starts, so each process forked from one parent (gunicorn --preload) has its own."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:4]}"


def _check_instance_id(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > MAX_INSTANCE_ID:
        raise InvalidOption(
            f"instance_id={value!r} must be a non-empty string of at most {MAX_INSTANCE_ID} "
            "characters"
        )
    if not value.isprintable():
        raise InvalidOption(
            f"instance_id={value!r} must be printable: no newline, tab or other control "
            "character (it is written into logs and history)"
        )
    return value


def _check_clock(clock: object) -> Clock | None:
    if clock is None:
        return None
    missing = [name for name in CLOCK_METHODS if not callable(getattr(clock, name, None))]
    if missing:
        raise InvalidOption(
            f"clock={clock!r} lacks {', '.join(missing)}: a clock provides now_ms() (wall "
            "clock, epoch ms), monotonic_ms(), async sleep(seconds) and async "
            "sleep_until(wall_ms, precise=False), as anarchon.testing.FakeClock does"
        )
    return clock  # type: ignore[return-value]


def _code_of(handler: Callable[..., Any]) -> CodeType | None:
    """The code object a handler's frames run, to recognise it on a stack."""
    target: Any = handler
    while isinstance(target, functools.partial):
        target = target.func
    target = inspect.unwrap(target)
    target = getattr(target, "__func__", target)
    code = getattr(target, "__code__", None)
    if code is None:
        call = getattr(type(target), "__call__", None)  # noqa: B004 - a callable object
        code = getattr(getattr(call, "__func__", call), "__code__", None)
    return code if isinstance(code, CodeType) else None


Claimed = tuple[ClaimRequest, ClaimOutcome | Exception, int]
"""A request, the backend's answer (or the error for that request alone), and when it was sent
(monotonic ms)."""


class Scheduler:
    """Runs cron jobs so that each slot of each job runs on exactly one instance.

    Every instance of the application creates the same scheduler with the same jobs; the backend
    decides who runs each slot. With no backend, a :class:`~anarchon.SQLiteBackend` on
    ``anarchon.db`` in the working directory (``ANARCHON_DB`` overrides the path) serves several
    processes on one host.

    :param backend: where claims, leases and history live.
    :param instance_id: this instance's name in history and logs: printable, 1 to 256
        characters. Default ``<host>-<pid>-<random>``, computed at :meth:`start` (after a fork).
    :param grace_ms: on :meth:`stop`, how long running handlers may finish (their leases still
        renewed) before they are cancelled and, on lease backends, handed over to a backup;
        0 to 86 400 000.
    :param clock: the clocks (tests pass :class:`anarchon.testing.FakeClock`); see
        ``docs/clocks.md``.
    :param max_workers: threads for plain (non-async) handlers, 1 to 1024. A slot of a plain
        job is claimed only while a thread is free for it.
    :param heartbeat_ms: how often this instance records itself and its jobs in the backend's
        registry (:meth:`cluster`, ``anarchon instances``), 100 to 3 600 000.
    """

    def __init__(
        self,
        backend: Backend | None = None,
        *,
        instance_id: str | None = None,
        grace_ms: int = DEFAULT_GRACE_MS,
        clock: Clock | None = None,
        max_workers: int = DEFAULT_MAX_WORKERS,
        heartbeat_ms: int = DEFAULT_HEARTBEAT_MS,
    ) -> None:
        if backend is not None and not isinstance(backend, Backend):
            raise InvalidOption(f"backend {backend!r} is not an anarchon Backend")
        grace_ms = check_int("grace_ms", grace_ms, GRACE, "Scheduler")
        max_workers = check_int("max_workers", max_workers, MAX_WORKERS, "Scheduler")
        self.heartbeat_ms = check_int("heartbeat_ms", heartbeat_ms, HEARTBEAT, "Scheduler")
        self._heartbeat: Heartbeat | None = None
        explicit_id = _check_instance_id(instance_id)
        given_clock = _check_clock(clock)
        if backend is None:
            from .backends.sqlite import SQLiteBackend

            backend = SQLiteBackend()
        self.backend = backend
        self.grace_ms = grace_ms
        self.max_workers = max_workers
        self._explicit_id = explicit_id
        self._default_id: tuple[int, str] | None = None  # (pid, id) before start
        self._clock: Clock = given_clock or SystemClock()
        self._jobs: dict[str, Job] = {}
        self._generation: dict[str, int] = {}
        self._state = _State.NEW
        self._counters: Counter[str] = Counter()
        self._clock_offset_ms: int | None = None
        self._backend_time = BackendTime(self._clock)
        self._threads = HandlerThreads(max_workers)
        self._timer = SlotTimer(self._clock, self._on_due, self._on_clock_step)
        self._executor = RunExecutor(backend, self._clock, self._threads, self._counters, grace_ms)
        self._watcher: BackupWatcher | None = None
        if isinstance(backend, LeaseBackend):
            self._watcher = BackupWatcher(
                backend,
                self._clock,
                "",
                self._jobs.get,
                self._on_taken,
                self._counters,
                self._threads,
            )
        self._tasks: set[asyncio.Future[Any]] = set()
        self._loops: list[asyncio.Future[Any]] = []
        self._stack: AsyncExitStack | None = None
        self._base: AsyncExitStack | None = None
        self._lingering: asyncio.Future[None] | None = None
        self._stop_began = 0
        self._claiming = 0
        self._claims_idle = asyncio.Event()
        self._claims_idle.set()
        self._skew_wake = asyncio.Event()
        self._early_warned_at: int | None = None
        self._keeper_thread: KeeperThread | None = None
        self._watchdog: LoopWatchdog | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._main_mailbox: Mailbox | None = None

    @property
    def instance_id(self) -> str:
        """This instance's name in history and logs (fixed when the scheduler starts)."""
        if self._explicit_id is not None:
            return self._explicit_id
        pid = os.getpid()
        if self._default_id is None or self._default_id[0] != pid:
            self._default_id = (pid, default_instance_id())
        return self._default_id[1]

    # -- jobs -------------------------------------------------------------------------------

    def job(
        self,
        name: str,
        schedule: str,
        *,
        timezone: Timezone = "UTC",
        jitter_ms: int | None = None,
        max_late_ms: int | None = None,
        history_ttl_ms: int | None = None,
        timeout_ms: int | None = None,
        lease_ms: int | None = None,
        max_attempts: int | None = None,
        overlap: Overlap | str | None = None,
        catch_up: CatchUp | str | None = None,
        catch_up_window_ms: int | None = None,
        handover: bool | None = None,
    ) -> Callable[[H], H]:
        """Decorator form of :meth:`add`; returns the handler unchanged."""

        def register(handler: H) -> H:
            self.add(
                name,
                schedule,
                handler,
                timezone=timezone,
                jitter_ms=jitter_ms,
                max_late_ms=max_late_ms,
                history_ttl_ms=history_ttl_ms,
                timeout_ms=timeout_ms,
                lease_ms=lease_ms,
                max_attempts=max_attempts,
                overlap=overlap,
                catch_up=catch_up,
                catch_up_window_ms=catch_up_window_ms,
                handover=handover,
            )
            return handler

        return register

    def add(
        self,
        name: str,
        schedule: str,
        handler: Handler,
        *,
        timezone: Timezone = "UTC",
        jitter_ms: int | None = None,
        max_late_ms: int | None = None,
        history_ttl_ms: int | None = None,
        timeout_ms: int | None = None,
        lease_ms: int | None = None,
        max_attempts: int | None = None,
        overlap: Overlap | str | None = None,
        catch_up: CatchUp | str | None = None,
        catch_up_window_ms: int | None = None,
        handover: bool | None = None,
    ) -> None:
        """Register a job; allowed while the scheduler runs.

        Options left as None take the backend's default (see the options table in the README).
        Raises a :class:`~anarchon.errors.ConfigurationError` naming the value and the rule.
        """
        if name in self._jobs:
            raise DuplicateJob(f"job name {name!r} is already registered; job names are unique")
        options = JobOptions(
            timezone=timezone,
            jitter_ms=jitter_ms,
            max_late_ms=max_late_ms,
            history_ttl_ms=history_ttl_ms,
            timeout_ms=timeout_ms,
            lease_ms=lease_ms,
            max_attempts=max_attempts,
            overlap=overlap,
            catch_up=catch_up,
            catch_up_window_ms=catch_up_window_ms,
            handover=handover,
        )
        job = build_job(name, schedule, handler, options, self.backend)
        self._jobs[name] = job
        self._generation[name] = self._generation.get(name, 0) + 1
        if self._state is _State.RUNNING:
            self._schedule_next(job, self._clock.now_ms())
            self._spawn(self._catch_up([job]))

    def remove(self, name: str) -> None:
        """Unregister a job; its running attempt, if any, finishes normally."""
        if self._jobs.pop(name, None) is None:
            raise JobNotFound(f"no job named {name!r} is registered on this scheduler")

    @property
    def jobs(self) -> dict[str, str]:
        """Registered jobs: name to cron expression."""
        return {name: job.schedule.expression for name, job in self._jobs.items()}

    def _require_job(self, name: str) -> Job:
        job = self._jobs.get(name)
        if job is None:
            raise JobNotFound(f"no job named {name!r} is registered on this scheduler")
        return job

    # -- life cycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the backend, catch up missed slots, and begin firing. A scheduler starts once.

        Raises :class:`~anarchon.errors.SchedulerStateError` if it was started before.
        """
        if self._state is not _State.NEW:
            raise SchedulerStateError(
                f"scheduler is {self._state.value}; it can start only once (make a new "
                "Scheduler to start again)"
            )
        # The default id is computed now, in the process that runs the scheduler: workers
        # forked from one parent (gunicorn --preload) each get their own, with their pid.
        if self._explicit_id is None:
            self._default_id = (os.getpid(), default_instance_id())
        await self.backend.start()
        self._state = _State.RUNNING
        self._stop_began = 0
        self._backend_time.assume_local()
        base, stack = AsyncExitStack(), AsyncExitStack()
        try:
            await self._start_services(base, stack)
        except BaseException:
            self._state = _State.STOPPING
            await stack.aclose()
            await base.aclose()
            self._state = _State.STOPPED
            raise
        self._stack, self._base = stack, base
        logger.info(
            "scheduler %s started with %d jobs on %s (%r)",
            self.instance_id,
            len(self._jobs),
            self.backend.name,
            self.backend,
            extra={"action": "started"},
        )

    async def _start_services(self, base: AsyncExitStack, stack: AsyncExitStack) -> None:
        """Start every service in order; each registers its clean-up on ``base`` (the backend,
        the handler threads, the lease keeper) or ``stack`` (the rest), undone in reverse order
        by :meth:`stop`: ``stack`` first, then ``base``."""
        backend = self.backend
        base.push_async_callback(backend.stop)
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._main_mailbox = Mailbox.here()
        base.callback(self._abandon_threads)
        await self._start_keeper(base, loop)
        # Runs drain (grace, then hand-over) while the keeper still renews their leases.
        stack.push_async_callback(self._drain)
        stack.push_async_callback(self._settle_claims)
        if self._watcher is not None:
            assert isinstance(backend, LeaseBackend)
            watcher = self._watcher
            watcher.instance = self.instance_id
            mailbox = self._main_mailbox

            def poke(job: str, slot_key: str, released: bool = True) -> None:
                # From the backend's listener, possibly on another thread: one wake-up of the
                # loop per batch of notifications (see Mailbox).
                mailbox.post(watcher.poke, job, slot_key, released)

            await backend.subscribe(poke)
            stack.push_async_callback(self._stop_watcher, self._loop_task("watcher", watcher.run))
        now = self._clock.now_ms()
        for job in list(self._jobs.values()):
            self._schedule_next(job, now)
        timer = self._loop_task("timer", self._timer.run)
        skew = self._loop_task("clock", self._watch_clock)
        stack.push_async_callback(_cancel_and_wait, [timer, skew])
        self._spawn(self._catch_up(list(self._jobs.values())))
        store = backend.registry()
        if store is not None:  # the registry: see _heartbeat
            jobs, offset = self._jobs.values, lambda: self._clock_offset_ms
            beat = Heartbeat(store, self._clock, self.heartbeat_ms, self.instance_id, jobs, offset)
            self._heartbeat = beat
            beat.start()
            stack.push_async_callback(beat.stop)

    async def _start_keeper(self, stack: AsyncExitStack, loop: asyncio.AbstractEventLoop) -> None:
        """Start the lease keeper: on the scheduler's own thread, with its own connection, when
        the backend can give one and the clock is the system clock; else on this loop. The
        thread also hosts the loop watchdog."""
        backend = self.backend
        threaded = type(self._clock) is SystemClock
        if threaded:
            self._watchdog = LoopWatchdog(
                loop, threading.get_ident(), self._clock.monotonic_ms, self._describe_blocker
            )
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
                    extra={"action": "keeper_thread"},
                )
        keeper: LeaseKeeper | None = None
        if threaded:
            host = KeeperThread(self._clock, self._watchdog, clone, self._make_keeper)
            self._keeper_thread = host
            stack.push_async_callback(host.stop)
            if await host.start():
                keeper = host.keeper
        if keeper is None and isinstance(backend, LeaseBackend):
            keeper = self._make_keeper(backend)
            keeper.bind()
            task = self._loop_task("lease keeper", keeper.run)
            stack.push_async_callback(_cancel_and_wait, [task])
            if threaded:
                logger.info(
                    "leases of %s are kept on the event loop (the backend gave no connection "
                    "of its own): a handler that blocks the loop can cost its lease",
                    backend.name,
                    extra={"action": "keeper_thread"},
                )
        self._executor.keeper = keeper
        self._executor.closed = False

    def _make_keeper(self, backend: LeaseBackend) -> LeaseKeeper:
        return LeaseKeeper(backend, self._clock, self._on_lease_lost)

    def _on_lease_lost(self, active: ActiveRun, reason: str) -> None:
        """From the keeper (maybe on its thread): flag the handler's context at once, then tell
        the executor on the event loop."""
        active.ctx._flag_lost(reason)
        if self._main_mailbox is not None:
            self._main_mailbox.post(self._executor.lose, active, reason)

    def _loop_task(self, name: str, loop: Callable[[], Any]) -> asyncio.Future[None]:
        task = asyncio.ensure_future(supervised(name, loop, self._clock.sleep))
        self._loops.append(task)
        return task

    async def _stop_watcher(self, task: asyncio.Future[None]) -> None:
        await _cancel_and_wait([task])
        if self._watcher is not None:
            await self._watcher.close(SETTLE_S)

    async def _settle_claims(self) -> None:
        """Let claims already sent come back (bounded): a won slot is then run or handed over."""
        if self._claiming:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._claims_idle.wait(), SETTLE_S)
        await _cancel_and_wait(list(self._tasks))

    async def _drain(self) -> None:
        await self._executor.drain(self._stop_began + self.grace_ms)

    def _abandon_threads(self) -> None:
        busy = self._threads.busy()
        if busy:
            logger.warning(
                "abandoning %d handler thread(s) still running after grace_ms=%d: %s. A thread "
                "cannot be stopped; these are daemon threads and end with the process",
                len(busy),
                self.grace_ms,
                "; ".join(busy),
                extra={"action": "threads_abandoned", "threads": len(busy)},
            )
        self._threads.close()

    async def stop(self) -> None:
        """Stop claiming, let running handlers finish up to ``grace_ms``, hand over the rest.

        Leases of running handlers are renewed until they end or the grace period is over. On a
        lease backend a run still going after that is cancelled and, once its handler has ended,
        its lease released at once, so a backup takes it over without waiting for expiry. An
        async handler that ignores its cancellation is waited for, its lease still renewed.
        Plain handlers' threads still running are abandoned (logged) and their leases left to
        expire: the process can exit.
        """
        if self._state in (_State.STOPPING, _State.STOPPED):
            return
        if self._state is _State.NEW:
            self._state = _State.STOPPED
            self._threads.close()
            return
        self._state = _State.STOPPING
        self._stop_began = self._clock.monotonic_ms()
        stack, self._stack = self._stack, None
        base, self._base = self._base, None
        try:
            if stack is not None:
                await stack.aclose()
        finally:
            stubborn = self._executor.stubborn()
            if base is not None and stubborn:
                # Handlers that ignore their cancellation keep their leases (and the backend
                # that records their results) until they end; stop() does not wait for them.
                # A process that exits meanwhile ends them, and their leases expire.
                self._lingering = asyncio.ensure_future(self._linger(stubborn, base))
                self._lingering.add_done_callback(self._task_done)
            elif base is not None:
                await base.aclose()
            self._state = _State.STOPPED
        logger.info("scheduler %s stopped", self.instance_id, extra={"action": "stopped"})

    async def _linger(self, tasks: list[asyncio.Task[None]], base: AsyncExitStack) -> None:
        try:
            await asyncio.wait(tasks)
        finally:
            await base.aclose()

    async def __aenter__(self) -> Scheduler:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    def run(self) -> None:
        """Run until SIGINT or SIGTERM, then stop gracefully. Blocks.

        Like ``asyncio.run(scheduler.serve())``, except that the process is not held at exit by
        a task that ignores cancellation (a handler that catches ``CancelledError`` and goes
        on): such a handler is given :data:`EXIT_WAIT_S` more to end (its lease still renewed,
        so its result is recorded), then logged and left behind, its lease left to expire.

        Raises :class:`~anarchon.errors.SchedulerStateError` inside a running event loop: use
        ``async with scheduler`` or ``await scheduler.serve()`` there.
        """
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            raise SchedulerStateError(
                "Scheduler.run() blocks and cannot be called inside a running event loop; "
                "in async code use 'async with scheduler: ...' or 'await scheduler.serve()'"
            )
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        main = loop.create_task(self.serve())
        try:
            loop.run_until_complete(main)
        finally:
            try:
                if not main.done():  # interrupted (KeyboardInterrupt before serve() took SIGINT)
                    main.cancel()  # serve() then stops the scheduler: bounded, let it finish
                    loop.run_until_complete(asyncio.wait([main]))
                # Runs whose handlers ignored their cancellation keep their leases while the
                # process lives: a handler that ends within EXIT_WAIT_S has its result recorded
                # (cancelling it again would only cut that short). Then the process exits: a
                # handler still going ends with it, unreleased; its lease expires.
                if self._lingering is not None and not self._lingering.done():
                    loop.run_until_complete(asyncio.wait([self._lingering], timeout=EXIT_WAIT_S))
                # Cancelling them again would only hurry them to an end whose result could not
                # be recorded any more: they are left as they are and end with the process.
                spared = {*self._executor.stubborn(), self._lingering}
                if self._executor.stubborn():
                    logger.warning(
                        "exiting with %d handler(s) that ignore their cancellation still "
                        "running; their runs are not handed over: a backup takes each over when "
                        "its lease expires",
                        len(self._executor.stubborn()),
                        extra={"action": "left_to_expire"},
                    )
                # asyncio.run() would wait for every task to accept its cancellation, for ever.
                left = [t for t in asyncio.all_tasks(loop) if not t.done() and t not in spared]
                loop.run_until_complete(_cancel_and_wait(left, EXIT_WAIT_S))
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.run_until_complete(
                    asyncio.wait([loop.create_task(loop.shutdown_default_executor())], timeout=1)
                )
            finally:
                asyncio.set_event_loop(None)
                loop.close()

    async def serve(self, stop_event: asyncio.Event | None = None) -> None:
        """Start, wait for SIGINT/SIGTERM (or ``stop_event``), stop: :meth:`run` for async code."""
        event = stop_event or asyncio.Event()
        loop = asyncio.get_running_loop()
        installed: list[signal.Signals] = []
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, event.set)
                installed.append(sig)
            except (NotImplementedError, RuntimeError, ValueError):  # not the main thread
                pass
        try:
            await self.start()
            await event.wait()
        finally:
            for sig in installed:
                loop.remove_signal_handler(sig)
            await self.stop()

    @property
    def running(self) -> bool:
        """True between :meth:`start` and :meth:`stop`."""
        return self._state is _State.RUNNING

    # -- queries ----------------------------------------------------------------------------

    def _require_started(self) -> None:
        if self._state is not _State.RUNNING:
            raise SchedulerStateError(
                f"scheduler is {self._state.value}; call 'await scheduler.start()' (or use "
                "'async with scheduler') first"
            )

    async def history(self, name: str, limit: int = 100) -> list[Run]:
        """Runs of job ``name``, newest first; works for any job the backend has records of."""
        self._require_started()
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise InvalidOption(f"limit={limit!r} must be an integer >= 0")
        return await self.backend.history(name, limit)

    async def last_run(self, name: str) -> Run | None:
        """The newest run of job ``name``, or None."""
        self._require_started()
        return await self.backend.last_run(name)

    async def run_now(self, name: str) -> Run:
        """Run job ``name`` now on this instance (trigger ``manual``) and return the finished run.

        The run is claimed like a slot of its own, so it gets a fence and, on lease backends,
        respects ``overlap='skip'``: if the previous run still holds its lease the manual run is
        recorded ``skipped`` and returned as such. A plain handler needs a free thread: if none
        frees up within 10 s, :class:`~anarchon.errors.SchedulerStateError` is raised.
        """
        self._require_started()
        job = self._require_job(name)
        reserved = False
        if not job.is_async:
            reserved = await self._reserve_thread(MANUAL_CLAIM_TIMEOUT_S)
            if not reserved:
                raise SchedulerStateError(
                    f"job {name!r} has a plain handler and every handler thread is busy "
                    f"(max_workers={self.max_workers}); try again later or raise max_workers"
                )
        request = self._request(job, None, Trigger.MANUAL)
        try:
            claimed = await self._claim([request], deadline_s=MANUAL_CLAIM_TIMEOUT_S)
            if not claimed:
                raise BackendUnavailable(
                    f"could not claim a manual run of {name!r}: {self.backend.name} is unavailable"
                )
            _, outcome, sent = claimed[0]
            if isinstance(outcome, Exception):
                raise outcome
            if outcome.status is not ClaimStatus.WON:
                return outcome.run
            assert outcome.ticket is not None
            active = self._executor.start(job, outcome.ticket, reserved=reserved, sent_ms=sent)
            reserved = False
        finally:
            if reserved:
                self._threads.unreserve()
        run = await active.result
        if run is not None:
            return run
        for recorded in await self.backend.history(name, limit=100):
            if recorded.run_id == request.run_id:
                return recorded
        return outcome.run

    async def cluster(self) -> ClusterView:
        """Read the backend's registry: every live instance, the jobs each carries, and the jobs
        whose definitions differ between instances (:mod:`anarchon.registry`)."""
        self._require_started()
        beat = self._heartbeat
        if beat is None:
            raise UnsupportedFeature(f"the {self.backend.name} backend keeps no registry")
        return await read_cluster(beat.store, beat.backend_now_ms())

    def metrics(self) -> dict[str, int | None]:
        """Counters since start (claims won and lost, runs by status, skips, takeovers, slots not
        claimed for want of a thread ...), jobs, running and watched runs, busy handler threads,
        the last measured clock offset from the backend, and the event loop's lag (ms, as the
        watchdog measured it; None without the scheduler's thread)."""
        out: dict[str, int | None] = dict(self._counters)
        out["jobs"] = len(self._jobs)
        out["running"] = len(self._executor.active)
        out["watched"] = len(self._watcher) if self._watcher is not None else 0
        out["handler_threads_busy"] = len(self._threads.busy())
        out["clock_offset_ms"] = self._clock_offset_ms
        watchdog = self._watchdog
        out["loop_lag_ms"] = watchdog.lag_ms if watchdog is not None else None
        out["loop_lag_max_ms"] = watchdog.max_lag_ms if watchdog is not None else None
        out["loop_blocked_ms"] = watchdog.blocked_ms if watchdog is not None else None
        return out

    # -- firing -----------------------------------------------------------------------------

    def _schedule_next(self, job: Job, after_ms: int) -> None:
        slot = job.schedule.next_slot(after_ms)
        jitter = random.randint(0, job.policy.jitter_ms) if job.policy.jitter_ms else 0
        self._timer.push(job.name, slot, slot + jitter, self._generation[job.name])

    def _on_due(self, batch: list[Due]) -> None:
        # "Too late" is a decision shared with other instances: judged on the backend's clock
        # as measured, not on this host's wall clock (which may have been stepped).
        now = self._backend_time.now_ms()
        fired: list[tuple[Job, int]] = []
        try:
            requests: list[ClaimRequest] = []
            reserved: set[str] = set()
            starved: list[ClaimRequest] = []
            early: list[Due] = []
            # On one host every instance's wall clock stepped alike: nobody is early.
            early_check = not self.backend.one_host
            for due in batch:
                job = self._jobs.get(due.job)
                if job is None or self._generation.get(due.job) != due.generation:
                    continue
                if early_check and due.slot - now > EARLY_TOLERANCE_MS:
                    early.append(due)
                    continue
                fired.append((job, due.slot))
                if self._state is not _State.RUNNING:
                    continue
                request = self._request(job, due.slot, Trigger.SCHEDULE, now)
                if request.skip_reason is None and not job.is_async:
                    # A plain handler needs a thread: no lease is taken before one is set
                    # aside. Without one this instance does not claim; others run the slot.
                    if not self._threads.reserve():
                        starved.append(request)
                        continue
                    reserved.add(request.run_id)
                requests.append(request)
            if starved:
                self._starved(starved)
            if requests:
                self._spawn(self._fire(requests, reserved))
            if early:
                self._wait_for_backend_time(early, now)
        finally:
            if fired:
                # After the claim is on its way: a batch of thousands would otherwise hold it.
                self._spawn(self._reschedule(fired, now))

    def _wait_for_backend_time(self, early: list[Due], backend_now: int) -> None:
        """Put slots that are due here but not yet by the backend's clock back on the timer, at
        the local wall time when the backend's clock reaches them (without jitter: it was
        spent). Claiming them now would be early for every other instance (a run overlapping
        the previous slot's, recorded as skipped)."""
        wall = self._clock.now_ms()
        self._counters["early_slots_deferred"] += len(early)
        for due in early:
            # Looked at again within a second: the estimate may be stale (the backend's clock
            # stepped too, and is being measured again after the step).
            wait = due.slot - backend_now
            if wait > EARLY_RECHECK_MS + EARLY_TOLERANCE_MS:
                wait = EARLY_RECHECK_MS
            self._timer.push(due.job, due.slot, wall + wait, due.generation)
        mono = self._clock.monotonic_ms()
        if self._early_warned_at is not None and mono - self._early_warned_at < SKEW_CHECK_S * 1000:
            return  # one warning a minute: a clock ahead defers every slot
        self._early_warned_at = mono
        first = early[0]
        logger.warning(
            "%d slot(s) (%s slot %s%s) are due by this host's clock but %d ms in the future by "
            "the %s backend's: this clock is ahead (stepped?); waiting for the backend's time",
            len(early),
            first.job,
            first.slot,
            f" and {len(early) - 1} more" if len(early) > 1 else "",
            first.slot - backend_now,
            self.backend.name,
            extra={"job": first.job, "slot": first.slot, "action": "slot_early"},
        )

    def _starved(self, requests: list[ClaimRequest]) -> None:
        self._counters["no_thread"] += len(requests)
        first = requests[0]
        logger.warning(
            "not claiming %d slot(s) of plain handlers (%s slot %s%s): all %d handler threads "
            "are busy (max_workers); other instances run them",
            len(requests),
            first.job,
            first.slot,
            f" and {len(requests) - 1} more" if len(requests) > 1 else "",
            self.max_workers,
            extra={"job": first.job, "slot": first.slot, "action": "no_thread"},
        )

    async def _reschedule(self, fired: list[tuple[Job, int]], now: int) -> None:
        """Put each fired job's next slot on the timer. Slots that are already too late (on the
        backend's clock) are passed over without a claim (the process was frozen)."""
        for n, (job, slot) in enumerate(fired):
            if self._jobs.get(job.name) is job:
                self._schedule_next(job, max(slot, now - job.policy.max_late_ms))
            if n % 512 == 511:
                await asyncio.sleep(0)

    def _request(
        self, job: Job, slot: int | None, trigger: Trigger, now: int | None = None
    ) -> ClaimRequest:
        skip_reason = None
        if slot is not None and now is not None and trigger is Trigger.SCHEDULE:
            late = now - slot
            if late > job.policy.max_late_ms:
                self._counters["too_late"] += 1
                skip_reason = (
                    f"too late: {self.instance_id} reached the slot {late} ms after "
                    f"it (max_late_ms={job.policy.max_late_ms})"
                )
                logger.warning(
                    "job %s slot %s: %s",
                    job.name,
                    slot,
                    skip_reason,
                    extra={"job": job.name, "slot": slot, "action": "too_late"},
                )
        policy = job.policy
        return ClaimRequest(
            job=job.name,
            slot=slot,
            run_id=_new_id(),
            token=_new_id(),
            instance=self.instance_id,
            trigger=trigger,
            lease_ms=policy.lease_ms,
            overlap=policy.overlap,
            history_ttl_ms=policy.history_ttl_ms,
            skip_reason=skip_reason,
        )

    async def _fire(self, requests: list[ClaimRequest], reserved: set[str]) -> None:
        try:
            for request, outcome, sent in await self._claim(requests):
                if not isinstance(outcome, ClaimOutcome):
                    continue  # refused for good; logged with its job
                ours = request.run_id in reserved
                if self._handle(outcome, ours, sent) is not None and ours:
                    reserved.discard(request.run_id)
        finally:
            for _ in reserved:
                self._threads.unreserve()

    async def _claim(
        self, requests: Sequence[ClaimRequest], deadline_s: float | None = None
    ) -> list[Claimed]:
        """Claim with retries while the backend is unavailable; fail closed.

        A scheduled request is retried only until its slot becomes too late (on the backend's
        clock); a manual or catch-up request until ``deadline_s`` (monotonic, if given).
        Dropped requests are logged, not run. A request the backend refuses for good (not a
        transient error) gets its error in its place; the others of its batch are unaffected.
        """
        self._claiming += 1
        self._claims_idle.clear()
        try:
            return await self._claim_retrying(list(requests), deadline_s)
        finally:
            self._claiming -= 1
            if not self._claiming:
                self._claims_idle.set()

    async def _claim_retrying(
        self, pending: list[ClaimRequest], deadline_s: float | None
    ) -> list[Claimed]:
        started = self._clock.monotonic_ms()
        error: BackendUnavailable | None = None
        for delay in backoff():
            sent = self._clock.monotonic_ms()
            try:
                answers = await isolate(self.backend.claim, pending, _job_of, "claiming a slot")
            except BackendUnavailable as exc:
                self._counters["claim_errors"] += 1
                if error is None:
                    logger.warning(
                        "claiming %d slot(s) failed, retrying until they are too late: %s",
                        len(pending),
                        exc,
                        extra={"action": "claim_retry", "job": pending[0].job},
                    )
                error = exc
            else:
                return [(r, a, sent) for r, a in zip(pending, answers, strict=True)]
            if self._state is not _State.RUNNING:
                return []
            await self._clock.sleep(delay)
            # Re-check after the pause: a slot that became too late meanwhile is not claimed.
            now = self._backend_time.now_ms()
            waited_ms = self._clock.monotonic_ms() - started
            keep: list[ClaimRequest] = []
            for request in pending:
                if self._expired(request, now, waited_ms, deadline_s):
                    logger.warning(
                        "job %s slot %s not claimed: %s unavailable (%s); nobody runs it on "
                        "a guess",
                        request.job,
                        request.slot,
                        self.backend.name,
                        error,
                        extra={"job": request.job, "slot": request.slot, "action": "claim_failed"},
                    )
                else:
                    keep.append(request)
            pending = keep
            if not pending:
                return []
        return []  # pragma: no cover

    def _expired(
        self, request: ClaimRequest, now: int, waited_ms: int, deadline_s: float | None
    ) -> bool:
        if deadline_s is not None and waited_ms > deadline_s * 1000:
            return True
        if request.trigger is Trigger.SCHEDULE and request.slot is not None:
            job = self._jobs.get(request.job)
            limit = job.policy.max_late_ms if job else 0
            return now - request.slot > limit
        return False

    def _handle(
        self, outcome: ClaimOutcome, reserved: bool = False, sent: int | None = None
    ) -> ActiveRun | None:
        """Act on a claim's outcome: run what was won, log the rest, watch runs others hold.

        Returns the run started (which then owns the thread reservation), or None."""
        run = outcome.run
        extra = {
            "job": run.job,
            "slot": run.slot_ms,
            "action": "claim_" + outcome.status.value,
            "holder": run.instance,
        }
        job = self._jobs.get(run.job)
        if outcome.status is ClaimStatus.WON:
            assert outcome.ticket is not None
            self._counters["claims_won"] += 1
            logger.debug("won %s slot %s", run.job, run.slot_ms, extra=extra)
            if job is not None:
                return self._executor.start(job, outcome.ticket, reserved=reserved, sent_ms=sent)
            error = "the job was removed before its claimed slot could run"
            self._spawn(self.backend.finish(outcome.ticket, RunStatus.FAILED, error))
        elif outcome.status is ClaimStatus.SKIPPED:
            self._counters["skipped"] += 1
            logger.info(
                "job %s slot %s skipped: %s",
                run.job,
                run.slot_ms,
                run.reason,
                extra={**extra, "reason": run.reason},
            )
        elif outcome.error is not None:
            # The backend refused this request alone (a value it cannot store): nobody runs it.
            self._counters["claims_refused"] += 1
            logger.error(
                "job %s slot %s: the %s backend refused the claim: %s",
                run.job,
                run.slot_ms,
                self.backend.name,
                outcome.error,
                extra={**extra, "action": "claim_refused"},
            )
        else:
            self._counters["claims_lost"] += 1
            logger.debug("lost %s slot %s to %s", run.job, run.slot_ms, run.instance, extra=extra)
            if self._watcher is not None and run.status == "running" and job is not None:
                slot_key = str(run.slot_ms) if run.slot_ms is not None else f"manual-{run.run_id}"
                self._watcher.watch(
                    run.job, slot_key, outcome.lease_expires_at_ms, outcome.backend_now_ms
                )
        return None

    def _on_taken(self, job: Job, ticket: Ticket, reserved: bool, sent: int) -> None:
        # Also while stopping: the run is then drained with the others, or handed over at once
        # if the grace period is over, instead of being left to expire.
        self._executor.start(job, ticket, reserved=reserved, sent_ms=sent)

    async def _reserve_thread(self, wait_s: float) -> bool:
        """Set a handler thread aside, waiting up to ``wait_s`` for one to free up."""
        deadline = self._clock.monotonic_ms() + wait_s * 1000
        while not self._threads.reserve():
            if self._clock.monotonic_ms() >= deadline or self._state is not _State.RUNNING:
                return False
            await self._clock.sleep(THREAD_POLL_S)
        return True

    # -- catch-up ---------------------------------------------------------------------------

    async def _catch_up(self, jobs: list[Job]) -> None:
        """Look up the last recorded slot of every job that catches up, in one backend call, and
        start a catch-up for each job that missed slots."""
        backend = self.backend
        wanted = [j for j in jobs if j.policy.catch_up != CatchUp.NONE]
        if not wanted or not isinstance(backend, LeaseBackend):
            return
        try:
            last_slots = await backend.last_slots([j.name for j in wanted])
        except BackendUnavailable as exc:
            logger.warning("catch-up skipped: %s", exc, extra={"action": "catch_up_failed"})
            return
        # Slots are wall-clock instants computed from this host's clock, as the timer's are.
        now = self._clock.now_ms()
        for job in wanted:
            policy = job.policy
            slots, left_out = missed_slots(
                job.schedule,
                last_slots.get(job.name),
                now,
                policy.catch_up_window_ms,
                CatchUp(policy.catch_up),
            )
            if slots:
                logger.info(
                    "catching up %d missed slot(s) of %s (%d older left out, catch_up=%s)",
                    len(slots),
                    job.name,
                    left_out,
                    policy.catch_up,
                    extra={"job": job.name, "action": "catch_up"},
                )
                self._spawn(self._catch_up_slots(job, slots))

    async def _catch_up_slots(self, job: Job, slots: list[int]) -> None:
        policy = job.policy
        # One slot at a time, oldest first. Before each claim an instance waits until no run of
        # the job is going (instances that start together may have read different last slots),
        # so catch-up runs do not overlap; the claim itself allows overlap, because a missed
        # slot must not be recorded skipped for overlapping another missed slot.
        idle_limit_s = policy.lease_ms * 2 / 1000
        for slot in slots:
            if self._state is not _State.RUNNING or not await self._until_idle(job, idle_limit_s):
                return
            active = await self._catch_up_slot(job, slot)
            if active is False:
                return
            if isinstance(active, ActiveRun):
                # Shielded: cancelling this catch-up (on stop) must not cancel the run's result.
                with contextlib.suppress(Exception):
                    await asyncio.shield(active.result)

    async def _catch_up_slot(self, job: Job, slot: int) -> ActiveRun | bool:
        """Claim one missed slot; the run started, True to go on, False to give up."""
        policy = job.policy
        reserved = False
        if not job.is_async:
            reserved = await self._reserve_thread(policy.max_late_ms / 1000)
            if not reserved:
                self._starved([self._request(job, slot, Trigger.CATCH_UP)])
                return False
        try:
            request = replace(self._request(job, slot, Trigger.CATCH_UP), overlap=Overlap.ALLOW)
            claimed = await self._claim([request], deadline_s=policy.max_late_ms / 1000)
            if not claimed:
                return False
            _, outcome, sent = claimed[0]
            if not isinstance(outcome, ClaimOutcome):
                return True
            active = self._handle(outcome, reserved, sent)
            if active is not None:
                reserved = False
                return active
            return True
        finally:
            if reserved:
                self._threads.unreserve()

    async def _until_idle(self, job: Job, limit_s: float) -> bool:
        """Wait up to ``limit_s`` until the job's newest run has ended; False if stopping."""
        began = self._clock.monotonic_ms()
        while self._state is _State.RUNNING:
            try:
                last = await self.backend.last_run(job.name)
            except BackendUnavailable:
                last = None
            waited = (self._clock.monotonic_ms() - began) / 1000
            if last is None or last.status.finished or waited >= limit_s:
                return True
            await self._clock.sleep(CATCH_UP_POLL_S)
        return False

    # -- clocks -----------------------------------------------------------------------------

    def _on_clock_step(self, step_ms: int) -> None:
        """The timer saw the wall clock step: measure the offset from the backend again now
        (the backend-time estimate itself runs on the monotonic clock and is unaffected)."""
        self._counters["clock_steps"] += 1
        self._skew_wake.set()

    async def _watch_clock(self) -> None:
        while True:
            self._skew_wake.clear()
            await self._measure_skew()
            await sleep_or_wake(self._clock.sleep(SKEW_CHECK_S), self._skew_wake)

    async def _measure_skew(self) -> None:
        clock = self._clock
        before, before_mono = clock.now_ms(), clock.monotonic_ms()
        try:
            server = await self.backend.server_time_ms()
        except BackendUnavailable:
            return
        after, after_mono = clock.now_ms(), clock.monotonic_ms()
        if server is None:
            return
        self._backend_time.measured(server, (before_mono + after_mono) // 2)
        offset = server - (before + after) // 2
        self._clock_offset_ms = offset
        budgets = [b for j in self._jobs.values() if (b := self.backend.skew_budget_ms(j.policy))]
        # Warn long before skew is unsafe: at a tenth of the tightest budget, and above 5 s anyway.
        threshold = min([5_000, *(b // 10 for b in budgets)])
        if abs(offset) > max(threshold, 250):
            self._counters["clock_skew_warnings"] += 1
            logger.warning(
                "clock of %s is %+d ms off the %s backend's clock; slots fire off time, and past "
                "%s ms a slot could run twice. Synchronise clocks (NTP).",
                self.instance_id,
                offset,
                self.backend.name,
                min(budgets) if budgets else "unbounded",
                extra={"action": "clock_skew", "offset_ms": offset},
            )

    # -- the loop watchdog ------------------------------------------------------------------

    def _describe_blocker(self, frame: FrameType | None) -> tuple[str, str | None]:
        """On the watchdog's thread: name the job (and handler, file and line) whose code is on
        the blocked loop's stack, else the innermost function."""
        loop = self._loop
        active = self._executor.running(asyncio.current_task(loop) if loop else None)
        codes: dict[CodeType, Job] = {}
        for registered in list(self._jobs.values()):
            code = _code_of(registered.handler)
            if code is not None:
                codes.setdefault(code, registered)
        innermost = frame
        found: FrameType | None = None
        while frame is not None:
            if frame.f_code in codes:
                found = frame
                break
            frame = frame.f_back
        job: Job | None = active.job if active is not None else None
        if job is None and found is not None:
            job = codes[found.f_code]
        where = found or innermost
        place = (
            f"{where.f_code.co_qualname} at {where.f_code.co_filename}:{where.f_lineno}"
            if where is not None
            else "unknown code"
        )
        if job is None:
            return f"code that is not a job's handler ({place})", None
        qualname = getattr(job.handler, "__qualname__", None)
        module = getattr(job.handler, "__module__", None)
        handler = f"{module}.{qualname}" if qualname and module else repr(job.handler)
        run = f", run {active.ticket.run_id[:8]}" if active is not None else ""
        return f"job {job.name!r} (handler {handler}{run}; in {place})", job.name

    # -- tasks ------------------------------------------------------------------------------

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Future[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error(
                "internal task failed",
                exc_info=task.exception(),
                extra={"action": "internal_error"},
            )


def _job_of(request: ClaimRequest) -> str:
    return request.job
