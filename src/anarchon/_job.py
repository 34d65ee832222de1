"""Jobs: a name, a schedule, a handler and options, validated and resolved against a backend."""

from __future__ import annotations

import inspect
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, TypeAlias

from ._models import CatchUp, Overlap
from ._schedule import CronSchedule
from .backend import LEASE_BACKENDS, Backend, Capability, JobPolicy
from .errors import InvalidJobName, InvalidOption, UnsupportedFeature

if TYPE_CHECKING:
    from ._context import RunContext

__all__ = ["Handler", "Job", "JobOptions"]

Handler: TypeAlias = Callable[["RunContext"], Awaitable[Any]] | Callable[["RunContext"], Any]

NAME_RULE: Final = re.compile(r"[A-Za-z0-9_-]{1,128}")
DEFAULT_JITTER_MS: Final = 2_000
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


@dataclass(frozen=True, slots=True, kw_only=True)
class JobOptions:
    """Options as the user gave them; None means "the default for this backend"."""

    timezone: str = "UTC"
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


class Job:
    """A registered job: validated schedule, handler and resolved policy."""

    __slots__ = ("handler", "is_async", "name", "options", "policy", "schedule", "timeout_ms")

    def __init__(
        self,
        name: str,
        schedule: CronSchedule,
        handler: Handler,
        options: JobOptions,
        policy: JobPolicy,
    ) -> None:
        self.name = name
        self.schedule = schedule
        self.handler = handler
        self.is_async = _is_async(handler)
        self.options = options
        self.policy = policy
        self.timeout_ms = options.timeout_ms

    def __repr__(self) -> str:
        return f"Job({self.name!r}, {self.schedule.expression!r}, tz={self.schedule.timezone!r})"


def build_job(
    name: str, expression: str, handler: Handler, options: JobOptions, backend: Backend
) -> Job:
    """Validate everything about a job and resolve its options against ``backend``."""
    check_name(name)
    if not callable(handler):
        raise InvalidOption(f"handler for job {name!r} must be callable, got {handler!r}")
    schedule = CronSchedule(expression, options.timezone)
    policy = resolve(name, options, backend)
    backend.check_job(policy)
    return Job(name, schedule, handler, options, policy)


def check_name(name: str) -> None:
    """Raise :class:`InvalidJobName` unless ``name`` matches ``[A-Za-z0-9_-]{1,128}``."""
    if not isinstance(name, str) or not NAME_RULE.fullmatch(name):
        raise InvalidJobName(
            f"job name {name!r} may contain only letters, digits, '_' and '-', 1 to 128 "
            "characters (names become keys and NATS subjects)"
        )


def _int(name: str, option: str, value: int | None, default: int, minimum: int) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidOption(f"{option}={value!r} for job {name!r} must be an integer")
    if value < minimum:
        raise InvalidOption(f"{option}={value!r} for job {name!r} must be at least {minimum}")
    return value


def _enum(name: str, option: str, value: str, kind: type[Overlap] | type[CatchUp]) -> Any:
    try:
        return kind(value)
    except ValueError:
        choices = ", ".join(repr(m.value) for m in kind)
        raise InvalidOption(
            f"{option}={value!r} for job {name!r} must be one of {choices}"
        ) from None


def resolve(name: str, opts: JobOptions, backend: Backend) -> JobPolicy:
    """Fill in defaults for ``backend`` and check every rule; return the job's policy."""
    lease = backend.is_lease_backend
    _require(name, backend, opts)
    jitter = _int(name, "jitter_ms", opts.jitter_ms, DEFAULT_JITTER_MS, 0)
    max_late = _int(name, "max_late_ms", opts.max_late_ms, DEFAULT_MAX_LATE_MS, 0)
    if jitter > max_late:
        raise InvalidOption(
            f"jitter_ms={jitter} for job {name!r} must not exceed max_late_ms={max_late}: an "
            "instance that waits out its jitter would find the slot too late"
        )
    ttl = _int(name, "history_ttl_ms", opts.history_ttl_ms, DEFAULT_HISTORY_TTL_MS, 1)
    if ttl <= jitter + max_late:
        raise InvalidOption(
            f"history_ttl_ms={ttl} for job {name!r} must exceed jitter_ms + max_late_ms = "
            f"{jitter + max_late}: a late instance could otherwise claim a slot whose record "
            "is gone"
        )
    _int(name, "timeout_ms", opts.timeout_ms, 1, 1)
    overlap_default = Overlap.SKIP if lease else Overlap.ALLOW
    catch_default = DEFAULT_CATCH_UP if lease else CatchUp.NONE
    return JobPolicy(
        name=name,
        jitter_ms=jitter,
        max_late_ms=max_late,
        lease_ms=_int(name, "lease_ms", opts.lease_ms, DEFAULT_LEASE_MS, MIN_LEASE_MS)
        if lease
        else 0,
        max_attempts=_int(
            name, "max_attempts", opts.max_attempts, DEFAULT_MAX_ATTEMPTS if lease else 1, 1
        ),
        overlap=_enum(
            name, "overlap", opts.overlap if opts.overlap is not None else overlap_default, Overlap
        ),
        catch_up=_enum(
            name, "catch_up", opts.catch_up if opts.catch_up is not None else catch_default, CatchUp
        ),
        catch_up_window_ms=_int(
            name, "catch_up_window_ms", opts.catch_up_window_ms, DEFAULT_CATCH_UP_WINDOW_MS, 1
        ),
        handover=opts.handover if opts.handover is not None else lease,
        history_ttl_ms=ttl if lease else None,
    )


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


def _is_async(handler: Callable[..., Any]) -> bool:
    target: Any = handler
    while hasattr(target, "func"):  # functools.partial
        target = target.func
    if inspect.iscoroutinefunction(target):
        return True
    call = getattr(target, "__call__", None)  # noqa: B004 - an object with async __call__
    return inspect.iscoroutinefunction(call)
