"""Jobs: a name, a schedule, a handler and options, validated and resolved against a backend."""

from __future__ import annotations

import inspect
import itertools
import operator
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, fields
from functools import partial
from typing import Any, Final, Generic, TypeAlias, TypedDict, TypeVar
from zoneinfo import ZoneInfo

from ._context import RunContext
from ._models import CatchUp, Overlap, Run
from ._options import Bound, check_bool, check_int, check_keywords, ms_text
from ._schedule import CronSchedule, shared_schedule
from .backend import LEASE_BACKENDS, Backend, Capability, JobPolicy
from .errors import InvalidJobName, InvalidOption, UnsupportedFeature

__all__ = ["Handler", "Job", "JobOptions", "OnFailure", "RetryPolicy", "Timezone"]

# RunContext and Run are imported at run time: Scheduler.add's and Scheduler.job's signatures
# name them through these aliases, and typing.get_type_hints resolves them.
Handler: TypeAlias = Callable[[RunContext], Awaitable[Any]] | Callable[[RunContext], Any]
"""A job's handler (:meth:`Scheduler.add <anarchon.Scheduler.add>`): a function of the run's
:class:`~anarchon.RunContext`, a coroutine function or a plain one (run in a worker thread)."""

NAME_RULE: Final = re.compile(r"[A-Za-z0-9_-]{1,128}")
DEFAULT_JITTER_MS: Final = 2_000
# The default jitter is at most this fraction of the shortest gap between a job's slots: a slot
# claimed late by its jitter must not still hold its lease when the next one comes (overlap).
JITTER_SHARE_OF_PERIOD: Final = 10
DEFAULT_MAX_LATE_MS: Final = 60_000
DEFAULT_LEASE_MS: Final = 15_000
DEFAULT_MAX_ATTEMPTS: Final = 3
DEFAULT_HISTORY_TTL_MS: Final = 7 * 24 * 3600 * 1000
# Catch-up defaults: a deploy or restart lasts minutes, so an hour covers it; after a longer
# outage, running yesterday's work unasked is worse than not. "latest" coalesces a backlog into
# one run, as celery beat and APScheduler's coalesce do.
DEFAULT_CATCH_UP: Final = CatchUp.LATEST
DEFAULT_CATCH_UP_WINDOW_MS: Final = 3_600_000
MIN_LEASE_MS: Final = 300
# A slot's claim leaves some milliseconds after the slot's time (the timer's wake-up, a batch of
# claims waiting its turn, an event loop busy elsewhere: more on a loaded host), and a
# claim older than max_late_ms is dropped or skipped: below this, slots go unrun.
MIN_MAX_LATE_MS: Final = 1_000
_SECOND: Final = 1_000
_DAY: Final = 24 * 3600 * _SECOND
_MINUTE_MS: Final = 60 * _SECOND
# The range of every numeric job option (README, "Options"). Each keeps slot + value far inside
# a 64-bit millisecond timestamp, and each upper end is past any sane use: a lease longer than a
# day is a stuck run nobody takes over; a catch-up window longer than the longest history finds
# no record to start from.
BOUNDS: Final = {
    "jitter_ms": Bound(0, 3600 * _SECOND, ms=True),
    "max_late_ms": Bound(MIN_MAX_LATE_MS, 7 * _DAY, ms=True),
    "timeout_ms": Bound(1, 30 * _DAY, ms=True),
    # Above jitter_ms + max_late_ms, so at least MIN_MAX_LATE_MS + 1 s.
    "history_ttl_ms": Bound(MIN_MAX_LATE_MS + _SECOND, 10 * 365 * _DAY, ms=True),
    "lease_ms": Bound(MIN_LEASE_MS, _DAY, ms=True),
    "max_attempts": Bound(1, 100),
    "catch_up_window_ms": Bound(1, 10 * 365 * _DAY, ms=True),
}
# The retry options: never None, so apart from the options a backend resolves.
RETRY_BOUNDS: Final = {
    "retries": Bound(0, 1000),
    "retry_backoff_ms": Bound(0, _DAY, ms=True),
    "retry_backoff_max_ms": Bound(0, 7 * _DAY, ms=True),
}
DEFAULT_RETRY_BACKOFF_MS: Final = 1_000
DEFAULT_RETRY_BACKOFF_MAX_MS: Final = 300_000

OnFailure: TypeAlias = Callable[["Run"], Awaitable[Any]] | Callable[["Run"], Any]
"""A job's ``on_failure`` hook: called with the failed :class:`~anarchon.Run` once per finally
failed slot (sync or async)."""
# How far ahead the shortest gap between slots is looked for: enough slots to see every
# irregularity of a usual cron pattern (a step that does not divide the minute or the hour
# repeats within 9 slots, weekdays within 5), never more than a year.
_GAP_SLOTS: Final = 24
_GAP_HORIZON_MS: Final = 400 * _DAY
_GAP_CACHE_SIZE: Final = 16_384
_GAPS: dict[tuple[str, ZoneInfo], int | None] = {}
_HANDLERS_CACHE_SIZE: Final = 256
# The resolved options a scheduler remembers (see Resolved): a handful of distinct option sets
# is usual, however many jobs share them.
_RESOLVED_CACHE_SIZE: Final = 256

V = TypeVar("V")


class _ByHandler(Generic[V]):
    """Answers remembered per handler object, which thousands of jobs often share: by its id,
    the handler kept beside its answer so that its id is not reused; at most
    :data:`_HANDLERS_CACHE_SIZE`, then forgotten all at once."""

    __slots__ = ("_found",)

    def __init__(self) -> None:
        self._found: dict[int, tuple[object, V]] = {}

    def get(self, handler: object) -> V | None:
        """The answer remembered for ``handler``, or None."""
        found = self._found.get(id(handler))
        return found[1] if found is not None and found[0] is handler else None

    def put(self, handler: object, answer: V) -> None:
        """Remember ``answer`` for ``handler``."""
        if len(self._found) >= _HANDLERS_CACHE_SIZE:
            self._found.clear()
        self._found[id(handler)] = (handler, answer)


_CALLABLE_WITH_CTX: Final[_ByHandler[bool]] = _ByHandler()
_IS_ASYNC: Final[_ByHandler[bool]] = _ByHandler()

Timezone: TypeAlias = str | ZoneInfo
"""A time zone: an IANA name such as ``"Europe/Athens"``, or a :class:`zoneinfo.ZoneInfo`."""


@dataclass(frozen=True, slots=True, kw_only=True)
class JobOptions:
    """Options as the user gave them; None means "the default for this backend"."""

    timezone: Timezone = "UTC"
    jitter_ms: int | None = None
    max_late_ms: int | None = None
    history_ttl_ms: int | None = None
    timeout_ms: int | None = None
    lease_ms: int | None = None
    max_attempts: int | None = None
    overlap: Overlap | str | None = None
    catch_up: CatchUp | str | None = None
    catch_up_window_ms: int | None = None
    handover: bool | None = None
    retries: int = 0
    retry_backoff_ms: int = DEFAULT_RETRY_BACKOFF_MS
    retry_backoff_max_ms: int = DEFAULT_RETRY_BACKOFF_MAX_MS
    on_failure: OnFailure | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryPolicy:
    """A job's retries on failure, validated: how many, and the backoff between them."""

    retries: int = 0
    backoff_ms: int = DEFAULT_RETRY_BACKOFF_MS
    backoff_max_ms: int = DEFAULT_RETRY_BACKOFF_MAX_MS

    def delay_ms(self, retry: int) -> int:
        """The backoff before retry number ``retry`` (1 for the first), before jitter:
        ``min(retry_backoff_ms * 2**(retry - 1), retry_backoff_max_ms)``."""
        exponent = min(max(retry - 1, 0), 62)
        delay: int = self.backoff_ms << exponent
        return min(delay, self.backoff_max_ms)


class JobKwargs(TypedDict, total=False):
    """The options of :meth:`Scheduler.add <anarchon.Scheduler.add>` as keyword arguments (the
    fields of :class:`JobOptions`), for :meth:`Scheduler.job <anarchon.Scheduler.job>` to
    forward."""

    timezone: Timezone
    jitter_ms: int | None
    max_late_ms: int | None
    history_ttl_ms: int | None
    timeout_ms: int | None
    lease_ms: int | None
    max_attempts: int | None
    overlap: Overlap | str | None
    catch_up: CatchUp | str | None
    catch_up_window_ms: int | None
    handover: bool | None
    retries: int
    retry_backoff_ms: int
    retry_backoff_max_ms: int
    on_failure: OnFailure | None


_DEFAULT_OPTIONS: Final = JobOptions()
_option_values: Final = operator.attrgetter(*JobOptions.__slots__)


def job_options(caller: str, options: Mapping[str, Any]) -> JobOptions:
    """:class:`JobOptions` from keyword arguments; a TypeError naming ``caller`` and the first
    unknown option, as a call with a misspelt keyword argument would raise."""
    if not options:
        return _DEFAULT_OPTIONS  # frozen: every job added without options shares it
    check_keywords(caller, options, JobKwargs.__optional_keys__)
    return JobOptions(**options)


@dataclass(slots=True, eq=False, repr=False)
class Job:
    """A registered job: validated schedule, handler and resolved policy."""

    name: str
    schedule: CronSchedule
    handler: Handler
    options: JobOptions
    policy: JobPolicy
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    is_async: bool = field(init=False)
    timeout_ms: int | None = field(init=False)

    def __post_init__(self) -> None:
        self.is_async = is_async(self.handler)
        self.timeout_ms = self.options.timeout_ms

    def __repr__(self) -> str:
        return f"Job({self.name!r}, {self.schedule.expression!r}, tz={self.schedule.timezone!r})"


Resolved: TypeAlias = dict[tuple[Any, ...], tuple[Backend, "partial[JobPolicy]", RetryPolicy]]
"""A scheduler's memory of resolved options (:func:`build_job`'s ``memo``): the policy (as a
maker of it for a job name, see :func:`_policy_maker`) and retries that one set of options
resolved to on one backend, whatever the job's name."""
# Every field of a policy but the job's name: what jobs on the same options share.
_SHARED_POLICY_FIELDS: Final = tuple(
    f.name for f in fields(JobPolicy) if f.init and f.name != "name"
)


def build_job(
    name: str,
    expression: str,
    handler: Handler,
    options: JobOptions,
    backend: Backend,
    memo: Resolved | None = None,
) -> Job:
    """Validate everything about a job and resolve its options against ``backend``.

    With ``memo``, options already resolved for another job (the same values, of the same
    types, on the same backend, and the same schedule where its period matters) are not checked
    again: 100 000 jobs on one set of options resolve it once. Only what passed is remembered,
    so a bad value raises for every job that has it, naming that job.
    """
    check_name(name)
    check_handler(name, handler)
    schedule = shared_schedule(expression, _zone_argument(options.timezone))
    key = found = None
    if memo is not None:
        key, found = _remembered(memo, options, schedule)
    if found is not None and found[0] is backend and not found[2].retries:
        policy = found[1](name=name)
        retry = found[2]
    else:
        policy = resolve(name, options, backend, schedule)
        retry = resolve_retries(name, options, backend)
        check_on_failure(name, options.on_failure)
        if key is not None and memo is not None:
            if len(memo) >= _RESOLVED_CACHE_SIZE:
                memo.clear()
            memo[key] = (backend, _policy_maker(policy), retry)
    backend.check_job(policy)
    return Job(name, schedule, handler, options, policy, retry)


def _remembered(
    memo: Resolved, options: JobOptions, schedule: CronSchedule
) -> tuple[tuple[Any, ...] | None, tuple[Backend, partial[JobPolicy], RetryPolicy] | None]:
    """The key of ``options`` in ``memo`` and what it holds: the option values with their types
    (``1`` and ``True`` are equal, but only one is a valid ``jitter_ms``) and the schedule where
    its period matters. The key is None when an option cannot be hashed (it is then resolved
    every time)."""
    values = _option_values(options)
    period = (schedule.expression, schedule.zone) if _period_matters(options, schedule) else None
    key = (values, tuple(map(type, values)), period)
    try:
        return key, memo.get(key)
    except TypeError:
        return None, None


def _policy_maker(policy: JobPolicy) -> partial[JobPolicy]:
    """``policy`` for any job name: ``maker(name=...)``. Its other fields are copied here, once
    per set of options rather than once per job (a call costs what the constructor does, and
    less than :func:`dataclasses.replace`), and a field added to :class:`JobPolicy` is copied
    without being listed."""
    return partial(JobPolicy, **{name: getattr(policy, name) for name in _SHARED_POLICY_FIELDS})


def resolve_retries(name: str, opts: JobOptions, backend: Backend) -> RetryPolicy:
    """Check the retry options of job ``name`` and return them; a job that retries needs a
    backend that keeps run requests (:meth:`~anarchon.backend.Backend.control`)."""
    owner = f"job {name!r}"
    retries = check_int("retries", opts.retries, RETRY_BOUNDS["retries"], owner)
    backoff = check_int(
        "retry_backoff_ms", opts.retry_backoff_ms, RETRY_BOUNDS["retry_backoff_ms"], owner
    )
    cap = check_int(
        "retry_backoff_max_ms",
        opts.retry_backoff_max_ms,
        RETRY_BOUNDS["retry_backoff_max_ms"],
        owner,
    )
    if cap < backoff:
        raise InvalidOption(
            f"retry_backoff_max_ms={cap} for {owner} must be at least retry_backoff_ms="
            f"{backoff}: it caps the backoff, which starts at retry_backoff_ms"
        )
    if retries and backend.control() is None:
        raise UnsupportedFeature(
            f"job {name!r} asks for retries={retries}, but the {backend.name} backend keeps no "
            "run requests (its control() is None), where retries are stored; use retries=0"
        )
    return RetryPolicy(retries=retries, backoff_ms=backoff, backoff_max_ms=cap)


def check_on_failure(name: str, hook: object) -> None:
    """Raise :class:`InvalidOption` unless ``hook`` is None or can be called as ``hook(run)``."""
    if hook is None:
        return
    if not callable(hook):
        raise InvalidOption(
            f"on_failure={hook!r} for job {name!r} must be None or a callable taking the failed "
            "Run (sync or async)"
        )
    try:
        signature = inspect.signature(hook)
    except (TypeError, ValueError):
        return  # a callable whose signature Python cannot tell
    try:
        signature.bind(object())
    except TypeError:
        raise InvalidOption(
            f"on_failure={hook!r} for job {name!r} cannot be called with one positional "
            "argument: anarchon calls on_failure(run) with the failed Run"
        ) from None


def check_name(name: str) -> None:
    """Raise :class:`InvalidJobName` unless ``name`` matches ``[A-Za-z0-9_-]{1,128}``."""
    if not isinstance(name, str) or not NAME_RULE.fullmatch(name):
        raise InvalidJobName(
            f"job name {name!r} may contain only letters, digits, '_' and '-', 1 to 128 "
            "characters (names become keys and NATS subjects)"
        )


def check_handler(name: str, handler: object) -> None:
    """Raise :class:`InvalidOption` unless ``handler`` can be called as ``handler(ctx)`` and is
    not a generator or async generator function (its body would never run).

    Checked when the job is added, so a handler that takes no argument (or two) fails there, not
    at its first slot. A callable whose signature Python cannot tell (some built-ins) passes.
    """
    if not callable(handler):
        raise InvalidOption(f"handler for job {name!r} must be callable, got {handler!r}")
    if _CALLABLE_WITH_CTX.get(handler):
        return  # thousands of jobs often share one handler: its signature is read once
    _refuse_generator(name, handler)
    try:
        signature = inspect.signature(handler)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(object())
        _CALLABLE_WITH_CTX.put(handler, True)
    except TypeError:
        label = getattr(handler, "__qualname__", None) or repr(handler)
        raise InvalidOption(
            f"handler {label}{signature} of job {name!r} cannot be called with one positional "
            "argument: anarchon calls handler(ctx) with the run's RunContext; write "
            "'def handler(ctx): ...' or 'async def handler(ctx): ...'"
        ) from None


def _refuse_generator(name: str, handler: Callable[..., Any]) -> None:
    """Raise :class:`InvalidOption` if ``handler`` (also through :func:`functools.partial` or a
    ``__call__``) is a generator or async generator function: calling it runs none of its body,
    and a run would be recorded ``succeeded`` for work never done."""
    target: Any = handler
    while isinstance(target, partial):
        target = target.func
    for candidate in (target, getattr(target, "__call__", None)):  # noqa: B004 - a __call__
        if inspect.isasyncgenfunction(candidate):
            kind = "an async generator function"
            made = "an async generator, which cannot be awaited"
        elif inspect.isgeneratorfunction(candidate):
            kind, made = "a generator function", "a generator"
        else:
            continue
        label = getattr(handler, "__qualname__", None) or repr(handler)
        raise InvalidOption(
            f"handler {label} of job {name!r} is {kind} (it has 'yield'): calling it only makes "
            f"{made}, so its body would never run; write 'def handler(ctx): ...' or "
            "'async def handler(ctx): ...' without 'yield'"
        )


def _zone_argument(timezone: object) -> Any:
    """What CronSchedule gets for ``timezone``: a ZoneInfo from the IANA database by its name
    (so the schedule shows the name), any other ZoneInfo as it is, a string unchanged."""
    if isinstance(timezone, ZoneInfo) and timezone.key:
        return timezone.key
    return timezone


def shortest_gap_ms(schedule: CronSchedule, after_ms: int) -> int | None:
    """The shortest time between two consecutive slots of ``schedule`` in its coming slots
    (at most 24, within about a year of ``after_ms``); None if fewer than two slots come.

    Remembered per expression and zone: thousands of jobs on one schedule pay for it once.
    """
    key = (schedule.expression, schedule.zone)
    if key in _GAPS:
        return _GAPS[key]
    slots: list[int] = []
    at = after_ms
    try:
        while len(slots) < _GAP_SLOTS and at - after_ms < _GAP_HORIZON_MS:
            at = schedule.next_slot(at)
            slots.append(at)
    except StopIteration:
        pass
    gaps = [b - a for a, b in itertools.pairwise(slots)]
    if len(_GAPS) >= _GAP_CACHE_SIZE:
        _GAPS.clear()
    gap = _GAPS[key] = min(gaps) if gaps else None
    return gap


def _int(name: str, option: str, value: int | None, default: int) -> int:
    if value is None:
        return default
    if option == "max_late_ms" and type(value) is int and 0 <= value < MIN_MAX_LATE_MS:
        raise InvalidOption(
            f"max_late_ms={value} for job {name!r} is out of range: it must be "
            f"{BOUNDS[option]}. A slot's claim is sent some milliseconds after the slot's time "
            "(more on a loaded host), and a claim later than max_late_ms is skipped or dropped, "
            f"so below {MIN_MAX_LATE_MS} ms slots would go unrun"
        )
    return check_int(option, value, BOUNDS[option], f"job {name!r}")


def _enum(name: str, option: str, value: str, kind: type[Overlap] | type[CatchUp]) -> Any:
    if isinstance(value, kind):
        return value
    try:
        return kind(value)
    except ValueError:
        choices = ", ".join(repr(m.value) for m in kind)
        raise InvalidOption(
            f"{option}={value!r} for job {name!r} must be one of {choices}"
        ) from None


def _jitter(name: str, opts: JobOptions, max_late: int, period: int | None) -> int:
    """The job's jitter: the one given, checked against the period and ``max_late_ms``, or the
    default, which never reaches either."""
    if opts.jitter_ms is None:
        cap = [DEFAULT_JITTER_MS, max_late // 2]
        if period is not None:
            cap.append(period // JITTER_SHARE_OF_PERIOD)
        return min(cap)
    jitter = _int(name, "jitter_ms", opts.jitter_ms, DEFAULT_JITTER_MS)
    if period is not None and jitter >= period:
        raise InvalidOption(
            f"jitter_ms={jitter} for job {name!r} must be less than the job's period, "
            f"{ms_text(period)} (the shortest gap between its slots): a slot claimed that late "
            "would still be running when the next one comes. Leave jitter_ms out for a default "
            f"of a tenth of the period ({period // JITTER_SHARE_OF_PERIOD} ms)"
        )
    if jitter and jitter >= max_late:
        raise InvalidOption(
            f"jitter_ms={jitter} for job {name!r} must be less than max_late_ms={max_late}: "
            "an instance that waits out its whole jitter would find the slot too late"
        )
    return jitter


def resolve(
    name: str, opts: JobOptions, backend: Backend, schedule: CronSchedule | None = None
) -> JobPolicy:
    """Fill in defaults for ``backend`` and check every rule; return the job's policy.

    ``schedule`` gives the period that the jitter must stay below (and its default derives from).
    """
    lease = backend.is_lease_backend
    if opts.handover is not None:
        check_bool("handover", opts.handover, f"job {name!r}")
    _require(name, backend, opts)
    max_late = _int(name, "max_late_ms", opts.max_late_ms, DEFAULT_MAX_LATE_MS)
    period = None
    if schedule is not None and _period_matters(opts, schedule):
        period = shortest_gap_ms(schedule, _now_ms())
    jitter = _jitter(name, opts, max_late, period)
    ttl = _int(name, "history_ttl_ms", opts.history_ttl_ms, DEFAULT_HISTORY_TTL_MS)
    if ttl <= jitter + max_late:
        raise InvalidOption(
            f"history_ttl_ms={ttl} for job {name!r} must exceed jitter_ms + max_late_ms = "
            f"{jitter + max_late}: a late instance could otherwise claim a slot whose record "
            "is gone"
        )
    _int(name, "timeout_ms", opts.timeout_ms, 1)
    overlap_default = Overlap.SKIP if lease else Overlap.ALLOW
    catch_default = DEFAULT_CATCH_UP if lease else CatchUp.NONE
    return JobPolicy(
        name=name,
        jitter_ms=jitter,
        max_late_ms=max_late,
        lease_ms=_int(name, "lease_ms", opts.lease_ms, DEFAULT_LEASE_MS) if lease else 0,
        max_attempts=_int(
            name, "max_attempts", opts.max_attempts, DEFAULT_MAX_ATTEMPTS if lease else 1
        ),
        overlap=_enum(
            name, "overlap", opts.overlap if opts.overlap is not None else overlap_default, Overlap
        ),
        catch_up=_enum(
            name, "catch_up", opts.catch_up if opts.catch_up is not None else catch_default, CatchUp
        ),
        catch_up_window_ms=_int(
            name, "catch_up_window_ms", opts.catch_up_window_ms, DEFAULT_CATCH_UP_WINDOW_MS
        ),
        handover=opts.handover if opts.handover is not None else lease,
        history_ttl_ms=ttl if lease else None,
    )


def _period_matters(opts: JobOptions, schedule: CronSchedule) -> bool:
    """Whether the jitter rules need the schedule's period. Without a seconds field, slots are
    at least a minute apart: a tenth of that is above the default jitter, and a jitter under a
    minute is under the period, so walking 24 slots ahead (most of what adding a daily job
    costs) is skipped."""
    jitter = opts.jitter_ms
    if schedule.seconds_field or jitter is None:
        return schedule.seconds_field
    # A jitter that is not an int in range is refused by _jitter, with the period in hand.
    return not (type(jitter) is int and 0 <= jitter < _MINUTE_MS)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _require(name: str, backend: Backend, opts: JobOptions) -> None:
    """Reject options that need a capability ``backend`` lacks, naming it and who has it."""
    wanted: list[Capability] = []
    if opts.lease_ms is not None or (opts.max_attempts is not None and opts.max_attempts != 1):
        wanted.append(Capability.BACKUP)
    if opts.overlap is not None and str(opts.overlap) == Overlap.SKIP:
        wanted.append(Capability.OVERLAP)
    if opts.catch_up is not None and str(opts.catch_up) != CatchUp.NONE:
        wanted.append(Capability.CATCH_UP)
    if opts.handover:
        wanted.append(Capability.HANDOVER)
    if opts.history_ttl_ms is not None:
        wanted.append(Capability.HISTORY_TTL)
    for feature in wanted:
        if feature not in backend.capabilities:
            raise UnsupportedFeature(
                f"job {name!r} asks for {feature.value}, which the {backend.name} backend does "
                f"not have; use {LEASE_BACKENDS} for it"
            )


def is_async(handler: Callable[..., Any]) -> bool:
    """Whether ``handler`` is called as a coroutine function (also through
    :func:`functools.partial` and an async ``__call__``); remembered per handler, which
    thousands of jobs often share."""
    found = _IS_ASYNC.get(handler)
    if found is None:
        found = _find_async(handler)
        _IS_ASYNC.put(handler, found)
    return found


def _find_async(handler: Callable[..., Any]) -> bool:
    target: Any = handler
    while hasattr(target, "func"):  # functools.partial
        target = target.func
    if inspect.iscoroutinefunction(target):
        return True
    call = getattr(target, "__call__", None)  # noqa: B004 - an object with async __call__
    return inspect.iscoroutinefunction(call)
