"""The scheduler: registers jobs, fires their slots, claims through the backend, runs winners.

A slot's life, module by module: the timer (:mod:`._timer`) hands it, due after its rank delay
(:mod:`._rendezvous`), to :mod:`._firing`, which has :mod:`._clock` (``BackendClock``) judge it
early or too late on the backend's clock, sets a thread aside for a plain handler's claim and puts
the job's next slot on the timer; :mod:`._claims` builds the request, claims it (fail-closed
retries) and acts on the outcome; :mod:`._runner` runs what was won (:mod:`._handler` calls the
handler; the run in progress is :mod:`._active`'s ``ActiveRun``) while :mod:`._keeper` renews the
lease, and :mod:`._results` records the result (batched, held while a burst starts, retried); on
stop :mod:`._drain` lets runs finish within the grace and hands over the rest; :mod:`._watcher`
takes over runs of instances that died; :mod:`._catchup` claims slots missed while no instance ran
and :mod:`._missed` records those it does not run; :mod:`._requests` runs the cluster's run
requests (triggers, retries) and :mod:`._retrying` stores retries and calls ``on_failure`` hooks;
pauses are the backend's (:mod:`anarchon.steering`). The counters are in :mod:`._metrics`, the log
fields in :mod:`.logs`. What operators call (history, run_now, pause, trigger, cluster, metrics,
health) is :mod:`._operations`, a mixin of :class:`Scheduler`; the process around it
(:meth:`Scheduler.run`'s event loop, :meth:`Scheduler.serve`'s signal handlers) is
:mod:`._process`. The parts above are built from the scheduler's options, linked, started and
called back by :mod:`._services`; :class:`Scheduler` keeps the jobs, the options' checks, the
life-cycle state and the stop.

Life cycle, declared once in :meth:`Scheduler.start` with an :class:`contextlib.AsyncExitStack`
(APScheduler 4's ``AsyncScheduler.__aenter__`` is the model): each service registers its own
clean-up as it starts (:class:`~._services.Services`), so :meth:`Scheduler.stop` undoes them in
reverse order. The long-lived loops run in one :class:`asyncio.TaskGroup`, held by a task of its
own (:mod:`._loops`: start and stop may run in different tasks), entered before the first loop
and left after the last:

1. leave the registry (the heartbeat ends and removes this instance's record, bounded) and stop
   reading run requests (a poll in flight may finish, bounded, so a request won is run or handed
   over);
2. stop firing (the timer) and measuring the clock; stop backup takeovers (the watcher), letting
   a takeover in flight settle;
3. let claims in flight settle (bounded), so a won slot is run or handed over;
4. let handlers run up to ``grace_ms`` while the lease keeper still renews their leases; cancel
   what is left and hand it over (release, :mod:`._drain`);
5. stop the lease keeper (and its thread and connection), leave the loops' group (empty by
   then), abandon handler threads still running (daemon threads: the process can exit), stop
   the backend.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid
from collections.abc import Callable
from contextlib import AsyncExitStack
from types import TracebackType
from typing import Final, Literal, TypeAlias, TypeVar, Unpack

from . import _process, otel
from ._clock import Clock, SystemClock, check_clock
from ._heartbeat import DEFAULT_HEARTBEAT_MS, HEARTBEAT
from ._job import Handler, Job, JobKwargs, Resolved, build_job, job_options
from ._metrics import Counters, NextSlots
from ._operations import ENDED, Operations
from ._operations import State as _State
from ._options import Bound, check_int, check_label
from ._requests import CONTROL_POLL, DEFAULT_CONTROL_POLL_MS
from ._services import Services
from ._urls import backend_from_url, default_backend
from .backend import Backend
from .errors import DuplicateJob, InvalidOption, JobNotFound, SchedulerStateError
from .logs import Action, log_fields

__all__ = ["Scheduler"]

logger = logging.getLogger("anarchon.scheduler")

H = TypeVar("H", bound=Handler)

LifeCycle: TypeAlias = Literal["new", "starting", "running", "stopping", "stopped"]
"""Where a scheduler is in its life (:attr:`Scheduler.state`)."""
_LIFE_CYCLE: Final[dict[_State, LifeCycle]] = {
    _State.NEW: "new",
    _State.RUNNING: "running",
    _State.STOPPING: "stopping",
    _State.STOPPED: "stopped",
}

DEFAULT_GRACE_MS: Final = 30_000
GRACE: Final = Bound(0, 24 * 3600 * 1000, ms=True)
DEFAULT_MAX_WORKERS: Final = 32
MAX_WORKERS: Final = Bound(1, 1024)
MAX_INSTANCE_ID: Final = 256


def default_instance_id() -> str:
    """``<hostname>-<pid>-<4 hex>``: unique per process, readable in history. Computed when the
    scheduler starts, so each process forked from one parent (gunicorn --preload) has its own."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:4]}"


def _check_instance_id(value: object) -> str | None:
    """The ``instance_id`` option, checked (None: the default, computed at start)."""
    if value is None:
        return None
    return check_label("instance_id", value, MAX_INSTANCE_ID)


class Scheduler(Operations):
    """Runs cron jobs so that each slot of each job runs on exactly one instance.

    Every instance of the application creates the same scheduler with the same jobs; the backend
    decides who runs each slot. With no backend, the backend named by the URL in
    ``$ANARCHON_BACKEND`` (which ``anarchon run --backend URL`` sets) if set, else a
    :class:`~anarchon.SQLiteBackend` on ``anarchon.db`` in the working directory (``ANARCHON_DB``
    overrides the path), which serves several processes on one host.

    :param backend: where claims, leases and history live: a backend, or its URL (made by
        :func:`~anarchon.backend_from_url`: ``"postgresql://db/app?schema=cron"``).
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
    :param control_poll_ms: how often this instance reads the run requests (triggers, retries)
        of the jobs it carries, 100 to 60 000; backends without a control store have none.
    """

    def __init__(
        self,
        backend: Backend | str | None = None,
        *,
        instance_id: str | None = None,
        grace_ms: int = DEFAULT_GRACE_MS,
        clock: Clock | None = None,
        max_workers: int = DEFAULT_MAX_WORKERS,
        heartbeat_ms: int = DEFAULT_HEARTBEAT_MS,
        control_poll_ms: int = DEFAULT_CONTROL_POLL_MS,
    ) -> None:
        if backend is not None and not isinstance(backend, Backend | str):
            raise InvalidOption(
                f"backend={backend!r} is neither an anarchon Backend nor a backend URL such as "
                "'sqlite:///anarchon.db' or 'postgresql://db/app'"
            )
        grace_ms = check_int("grace_ms", grace_ms, GRACE, "Scheduler")
        max_workers = check_int("max_workers", max_workers, MAX_WORKERS, "Scheduler")
        self.heartbeat_ms = check_int("heartbeat_ms", heartbeat_ms, HEARTBEAT, "Scheduler")
        self.control_poll_ms = check_int(
            "control_poll_ms", control_poll_ms, CONTROL_POLL, "Scheduler"
        )
        self._started_ms: int | None = None
        explicit_id = _check_instance_id(instance_id)
        given_clock = check_clock(clock)
        #: The URL the backend was made from: the one given, or ``$ANARCHON_BACKEND``'s when
        #: the scheduler was given no backend; None otherwise.
        self.backend_url: str | None = None
        if backend is None:
            backend, self.backend_url = default_backend()
        elif isinstance(backend, str):
            self.backend_url = backend
            backend = backend_from_url(backend)
        self.backend = backend
        self.grace_ms = grace_ms
        self.max_workers = max_workers
        self._explicit_id = explicit_id
        self._default_id: tuple[int, str] | None = None  # (pid, id) before start
        self._clock: Clock = given_clock or SystemClock()
        self._jobs: dict[str, Job] = {}
        self._resolved: Resolved = {}  # options resolved once for every job that shares them
        self._jobs_version = 0  # counts adds and removals: see Heartbeat
        self._state = _State.NEW
        self._counters = Counters()
        self._next_slots: NextSlots = {}  # the metrics' next slots, per schedule
        # The parts a slot goes through, their start in order and their clean-ups.
        self._services = Services(
            backend,
            self._clock,
            self._jobs,
            self._counters,
            max_workers=max_workers,
            grace_ms=grace_ms,
            heartbeat_ms=self.heartbeat_ms,
            control_poll_ms=self.control_poll_ms,
            running=lambda: self.running,
            jobs_version=lambda: self._jobs_version,
            stop_began=lambda: self._stop_began,
            # Not self.stop: looked up at the call, so a stop replaced on the instance after
            # __init__ (a mock, a wrapper) is the one the guard calls.
            stop=lambda: self.stop(),
        )
        self._stack: AsyncExitStack | None = None
        self._base: AsyncExitStack | None = None
        self._lingering: asyncio.Future[None] | None = None
        self._starting: asyncio.Future[None] | None = None  # while start() is under way
        self._stopping: asyncio.Task[None] | None = None  # the stop, once begun (see stop())
        self._stop_waiters = 0  # stop() calls awaiting it
        self._stop_reported = False  # its failure was raised to a caller, or logged
        self._stop_began = 0

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

    def job(self, name: str, schedule: str, **options: Unpack[JobKwargs]) -> Callable[[H], H]:
        """Decorator form of :meth:`add`, with the same options; returns the handler unchanged.

        ``@scheduler.job("report", "0 6 * * *", timezone="Europe/Athens", lease_ms=60_000)``
        """
        job_options("Scheduler.job", options)  # at once, not when the decorator is applied

        def register(handler: H) -> H:
            self.add(name, schedule, handler, **options)
            return handler

        return register

    def add(self, name: str, schedule: str, handler: Handler, **options: Unpack[JobKwargs]) -> None:
        """Register a job: ``handler`` runs once per slot of ``schedule``, on one instance.

        Allowed before :meth:`start` and while the scheduler runs. The options are keyword
        arguments; one left out (or None) takes its default, which for some depends on the
        backend (lease backends; NATS):

        - ``timezone`` (``"UTC"``): the zone the expression is read in, an IANA name or a
          :class:`zoneinfo.ZoneInfo`.
        - ``jitter_ms`` (``min(2000, period / 10, max_late_ms / 2)``; 0 to 3 600 000, below the
          period and ``max_late_ms``): how long after the slot an instance may wait before
          claiming; the instance ranked first for the slot claims at once.
        - ``max_late_ms`` (60 000; 1 s to 7 days): an instance later than this after the slot
          does not claim it, and records it ``skipped`` (``too late``) if nobody ran it.
        - ``timeout_ms`` (none; 1 ms to 30 days): cancel the handler after this long; the run is
          ``failed``.
        - ``history_ttl_ms`` (7 days; 2 s to 10 years, above ``jitter_ms + max_late_ms``;
          refused on NATS): records older than this are pruned.
        - ``lease_ms`` (15 000; 300 ms to 1 day): the run's lease, renewed every third of it.
        - ``max_attempts`` (3, on NATS 1; 1 to 100): attempts per slot, takeovers of a crashed
          run included.
        - ``overlap`` (``"skip"``, on NATS ``"allow"``): with ``"skip"`` a slot that comes while
          the previous run holds its lease is recorded ``skipped`` (``overlap``); slots due at
          once after a freeze are decided by ``catch_up`` instead.
        - ``catch_up`` (``"latest"``, on NATS ``"none"``): on start, run the slots missed while
          no instance ran: ``"none"``, one run for them (``"latest"``) or each, oldest first
          (``"all"``). It decides a backlog too, several slots due at once because this
          instance fell behind (its process frozen, its clock stepped forward): ``"none"`` and
          ``"latest"`` claim only the newest (it runs within ``max_late_ms``) and record the
          older ones ``skipped`` (``behind: ...``); ``"all"`` runs those inside
          ``catch_up_window_ms``, oldest first.
        - ``catch_up_window_ms`` (1 hour; 1 ms to 10 years): only slots this recent are caught
          up.
        - ``handover`` (True, on NATS False): on stop, release an unfinished run's lease so
          that a backup runs it again at once.
        - ``retries`` (0; 0 to 1000): a run whose handler fails is run again up to this many
          times, each a new run (trigger ``retry``) on whichever instance claims it; it needs a
          backend with a control store.
        - ``retry_backoff_ms`` (1000; 0 to 1 day): the wait before the first retry, doubling
          per retry (each jittered down to half).
        - ``retry_backoff_max_ms`` (300 000; ``retry_backoff_ms`` to 7 days): the longest wait.
        - ``on_failure`` (None): called (plain or async) with the failed :class:`~anarchon.Run`
          once per finally failed slot, on the instance that recorded the failure; what it
          raises is logged.

        :param name: the job's name, unique on this scheduler: 1 to 128 letters, digits, ``_``
            and ``-``.
        :param schedule: a cron expression: 5 fields, 6 with seconds first, or a macro such as
            ``@daily`` (:class:`~anarchon.CronSchedule`).
        :param handler: called with the run's :class:`~anarchon.RunContext`: an ``async def``
            runs on the event loop, a plain function on a worker thread.
        :param options: the options above.

        Raises a :class:`~anarchon.errors.ConfigurationError` naming the value and the rule, and
        :class:`~anarchon.errors.SchedulerStateError` once :meth:`stop` was called (the job
        would never fire).
        """
        if self._state is _State.STOPPING or self._state is _State.STOPPED:
            raise SchedulerStateError(
                f"cannot add job {name!r}: the scheduler {ENDED[self._state]} and would never "
                "fire it; a scheduler starts only once, so add the job to a new Scheduler"
            )
        if name in self._jobs:
            raise DuplicateJob(f"job name {name!r} is already registered; job names are unique")
        chosen = job_options("Scheduler.add", options)
        job = build_job(name, schedule, handler, chosen, self.backend, self._resolved)
        self._jobs[name] = job
        self._jobs_version += 1
        self._services.firing.added(name)
        if self._state is _State.RUNNING:
            self._services.carry_added(job)

    def remove(self, name: str) -> None:
        """Unregister a job; its running attempt, if any, finishes normally."""
        self._jobs_version += 1
        if self._jobs.pop(name, None) is None:
            raise JobNotFound(f"no job named {name!r} is registered on this scheduler")

    @property
    def jobs(self) -> dict[str, str]:
        """Registered jobs: name to cron expression."""
        return {name: job.schedule.expression for name, job in self._jobs.items()}

    # -- life cycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the backend, catch up missed slots, and begin firing. A scheduler starts once.

        Raises :class:`~anarchon.errors.SchedulerStateError` if it was started before.
        """
        self._check_startable()
        # Until it ends, a second start() is refused and stop() waits for it.
        self._starting = starting = asyncio.get_running_loop().create_future()
        try:
            await self._start()
        finally:
            self._starting = None  # if the backend did not start, start() may be tried again
            starting.set_result(None)

    async def _start(self) -> None:
        """:meth:`start`'s work: the backend, then the services (undone if one fails)."""
        # The default id is fixed now, in the process that runs the scheduler: workers forked
        # from one parent (gunicorn --preload) each get their own, with their pid. A start tried
        # again in the same process (the backend was out of reach) keeps the id it had, so the
        # process's log lines name one instance.
        if self._explicit_id is None and (
            self._default_id is None or self._default_id[0] != os.getpid()
        ):
            self._default_id = (os.getpid(), default_instance_id())
        await asyncio.to_thread(otel.preload)
        await self.backend.start()
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
            extra=log_fields(Action.STARTED),
        )

    def _check_startable(self) -> None:
        """Raise :class:`~anarchon.errors.SchedulerStateError` unless :meth:`start` may begin:
        checked before anything is touched, so a refused call leaves a running scheduler
        alone."""
        if self._state is not _State.NEW or self._starting is not None:
            state = "starting" if self._starting is not None else self._state.value
            raise SchedulerStateError(
                f"scheduler is {state}; it can start only once (make a new Scheduler to start "
                "again)"
            )

    async def _start_services(self, base: AsyncExitStack, stack: AsyncExitStack) -> None:
        """Start every service in order (:class:`._services.Services`); each registers its
        clean-up on ``base`` (the backend, the handler threads, the loops' group, the lease
        keeper) or ``stack`` (the rest), undone in reverse order by :meth:`stop`: ``stack``
        first, then ``base``. The scheduler runs from the moment the loops' group is entered."""
        await self._services.prepare(base, self.instance_id)
        self._state = _State.RUNNING
        self._started_ms = self._clock.now_ms()
        self._stop_began = 0
        await self._services.start(base, stack)

    # -- the stop ---------------------------------------------------------------------------

    async def stop(self) -> None:
        """Stop claiming, let running handlers finish up to ``grace_ms``, hand over the rest.

        Leases of running handlers are renewed until they end or the grace period is over. On a
        lease backend a run still going after that is cancelled and, once its handler has ended,
        its lease released at once, so a backup takes it over without waiting for expiry. An
        async handler that ignores its cancellation is waited for, its lease still renewed.
        Plain handlers' threads still running are abandoned (logged) and their leases left to
        expire: the process can exit.

        The stop happens once, in a task of its own, and every call waits for it: a call made
        while it goes on returns when it ends, one made after returns at once. Cancelling a
        call (a timeout, a lifespan cancelled) does not cut the stop short: it goes on, drains
        and hands over. A call during :meth:`start` waits for it, then stops what it started.
        Awaited by a handler of this scheduler, it begins the stop and returns at once (the
        stop would wait for that handler's own run): the run is drained with the others.
        """
        while self._starting is not None:  # a stop during start() stops what it started
            await asyncio.shield(self._starting)
        if self._state is _State.NEW:
            self._state = _State.STOPPED
            self._services.threads.close()
            return
        stopping = self._stopping
        if stopping is None:
            if self._state is not _State.RUNNING:
                return  # a start that failed and undid itself
            self._state = _State.STOPPING
            self._stop_began = self._clock.monotonic_ms()
            stopping = asyncio.get_running_loop().create_task(
                self._stop(), name=f"anarchon stop of {self.instance_id}"
            )
            stopping.add_done_callback(self._stop_ended)
            self._stopping = stopping
        if stopping.done() or self._services.executor.running(asyncio.current_task()) is not None:
            return
        self._stop_waiters += 1
        try:
            # Shielded: a caller cancelled stops waiting; the stop goes on.
            await asyncio.shield(stopping)
        except asyncio.CancelledError:
            raise
        except BaseException:
            self._stop_reported = True  # its failure, raised to this caller
            raise
        finally:
            self._stop_waiters -= 1
            if not self._stop_waiters:
                self._report_stop_failure()

    async def _stop(self) -> None:
        """The stop's task (see :meth:`stop`)."""
        await self._stop_services()
        logger.info("scheduler %s stopped", self.instance_id, extra=log_fields(Action.STOPPED))

    def _stop_ended(self, task: asyncio.Task[None]) -> None:
        """The stop's task ended: log its failure if no call is left to raise it in."""
        if not self._stop_waiters:
            self._report_stop_failure()

    def _report_stop_failure(self) -> None:
        """Log the stop's failure when no call is left to raise it in (all were cancelled, even
        as it ended, or a handler began it): logged once, never lost."""
        task = self._stopping
        if task is None or not task.done() or task.cancelled() or self._stop_reported:
            return
        exc = task.exception()
        if exc is not None:
            self._stop_reported = True
            logger.error(
                "stopping scheduler %s failed",
                self.instance_id,
                exc_info=exc,
                extra=log_fields(Action.INTERNAL_ERROR),
            )

    async def _stop_services(self) -> None:
        """Undo :meth:`_start_services`: ``stack`` (draining among it), then ``base``."""
        stack, self._stack = self._stack, None
        base, self._base = self._base, None
        try:
            if stack is not None:
                await stack.aclose()
        finally:
            stubborn = self._services.executor.stubborn()
            task = asyncio.current_task()
            cut_short = task is not None and task.cancelling() > 0
            if base is not None and stubborn and not cut_short:
                # Handlers that ignore their cancellation keep their leases (and the backend
                # that records their results) until they end; stop() does not wait for them.
                # A process that exits meanwhile ends them, and their leases expire. Not when
                # the stop itself is cancelled (the loop ends: asyncio.run()'s end, a third
                # signal): a task begun then would be left pending; the process leaves them.
                self._lingering = asyncio.ensure_future(self._linger(stubborn, base))
                self._lingering.add_done_callback(self._services.task_done)
            elif base is not None:
                await base.aclose()
            self._state = _State.STOPPED

    async def _linger(self, tasks: list[asyncio.Task[None]], base: AsyncExitStack) -> None:
        """After the stop, wait for the handlers that ignore their cancellation, then undo
        ``base`` (the lease keeper, the backend)."""
        try:
            await asyncio.wait(tasks)
        finally:
            await base.aclose()

    async def __aenter__(self) -> Scheduler:
        """``async with scheduler``: :meth:`start` it."""
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Leaving ``async with scheduler``: :meth:`stop` it."""
        await self.stop()

    def run(self, stop_event: asyncio.Event | None = None) -> None:
        """Run until SIGINT or SIGTERM (or ``stop_event`` is set: ``anarchon run`` sets it for
        a signal that came before the event loop's own handlers were installed), then stop
        gracefully (a second signal ends the grace period at once: see :meth:`serve`). Blocks.

        Like ``asyncio.run(scheduler.serve())``, except that the process is not held at exit by
        a task that ignores cancellation (a handler that catches ``CancelledError`` and goes
        on): such a handler is given :data:`EXIT_WAIT_S` more to end (its lease still renewed,
        so its result is recorded), then logged and left behind, its lease left to expire.

        Raises :class:`~anarchon.errors.SchedulerStateError` inside a running event loop (use
        ``async with scheduler`` or ``await scheduler.serve()`` there), outside the main thread
        (only it can take the signals: in another thread, ``asyncio.run(scheduler.serve(stop))``
        with an :class:`asyncio.Event` set through ``loop.call_soon_threadsafe``), and if the
        scheduler was started before (it is left as it is).
        """
        self._check_startable()
        _process.run(
            lambda: self.serve(stop_event),
            lambda: self._stopping,
            lambda: self._lingering,
            self._services.executor.stubborn,
        )

    async def serve(self, stop_event: asyncio.Event | None = None) -> None:
        """Start, wait for SIGINT/SIGTERM (or ``stop_event``), stop: :meth:`run` for async code.

        A signal (or ``stop_event``) while the start is still under way cancels it: what it had
        begun is undone, nothing is claimed, and ``serve()`` returns (logged
        ``start_cancelled``) instead of waiting for the backend to answer.

        A second SIGINT or SIGTERM while it stops ends the grace period at once: running
        handlers are cancelled and handed over (logged ``grace_cut_short``); a third one is
        not caught (SIGTERM then ends the process, SIGINT raises ``KeyboardInterrupt``).

        Raises :class:`~anarchon.errors.SchedulerStateError` if the scheduler was started before,
        leaving it as it is (neither stopped nor its signal handlers taken).
        """
        self._check_startable()
        await _process.serve(self.start, self.stop, stop_event, self._services.executor.hurry)

    @property
    def running(self) -> bool:
        """True between :meth:`start` and :meth:`stop`: from the moment its services run, in
        the last part of :meth:`start` (catching up missed slots) too; :attr:`state` tells a
        start under way from one that has ended."""
        return self._state is _State.RUNNING

    @property
    def state(self) -> LifeCycle:
        """Where the scheduler is in its life, read-only: ``"new"`` (not started, or a start
        that failed before anything ran: it may be tried again), ``"starting"`` (:meth:`start`
        under way), ``"running"`` (started, :meth:`stop` not called), ``"stopping"`` (the stop
        under way, or the clean-up of a start that failed), ``"stopped"``."""
        if self._starting is not None and self._state in (_State.NEW, _State.RUNNING):
            return "starting"
        return _LIFE_CYCLE[self._state]
