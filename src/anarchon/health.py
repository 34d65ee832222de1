"""Is this scheduler well? :meth:`Scheduler.health() <anarchon.Scheduler.health>` answers with a
typed :class:`Health`; :func:`healthz` answers an HTTP probe (``/healthz``) from another thread,
even while the event loop is blocked; ``anarchon health`` asks the backend's registry from
outside the process (``docs/observability.md``).

Two verdicts:

* ``live``: the process works: the scheduler is running, its loops (timer, clock, watcher,
  run requests, heartbeat, lease keeper and its thread) are alive and the event loop is not
  blocked. A liveness probe restarts a process that is not live.
* ``healthy``: live, and the backend answers (a cheap call: its clock) and this host's clock
  is within the skew budget of the jobs (past it a slot could run twice). What only slows the
  scheduler down (a lagging event loop, a slow backend, a clock drifting toward the budget, a
  registry that cannot be written) is a warning and leaves it healthy.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Final, NamedTuple

from ._observation import ObservedState
from ._redact import redact_url
from ._watchdog import BLOCK_WARN_MS
from .errors import InvalidOption

if TYPE_CHECKING:
    from ._observation import Observation
    from ._scheduler import Scheduler
    from .backend import Backend

__all__ = ["DEFAULT_TIMEOUT_S", "Health", "ObservedState", "healthz"]

#: How long :meth:`Scheduler.health` waits for the backend, and :func:`healthz` for the loop (s).
DEFAULT_TIMEOUT_S: Final = 2.0
#: The longest ``timeout_s`` of :meth:`Scheduler.health` and :func:`healthz`, and of
#: ``anarchon health --timeout`` (s): an hour is past any probe's patience.
MAX_TIMEOUT_S: Final = 3600
#: A backend answer slower than this (ms) is a warning.
SLOW_BACKEND_MS: Final = 1_000
#: A heartbeat older than this many intervals is a warning (the registry cannot be written).
STALE_HEARTBEATS: Final = 3


@dataclass(frozen=True, slots=True, kw_only=True)
class Health:
    """A scheduler's health at one moment (:meth:`Scheduler.health`).

    ``problems`` say why it is not healthy (each one sentence), ``warnings`` what deserves a
    look without making it unhealthy. Times are milliseconds; None where not measured.
    """

    healthy: bool
    """Live, the backend reachable and the clock within budget: nothing in ``problems``."""
    live: bool
    """Running, every loop alive, the event loop not blocked."""
    problems: tuple[str, ...] = ()
    """Why it is not healthy, one sentence each; empty when healthy."""
    warnings: tuple[str, ...] = ()
    """What deserves a look without making it unhealthy (a slow backend, a clock off the backend's,
    a stale heartbeat), one sentence each."""
    instance: str
    """The scheduler's instance id."""
    state: ObservedState
    """``new``, ``running``, ``stopping`` or ``stopped``."""
    backend: str
    """The backend's name (``sqlite``, ``postgres``, ``redis``, ``nats``, ``memory``)."""
    backend_reachable: bool | None = None
    """None when not checked (:func:`healthz` while the event loop does not answer)."""
    backend_latency_ms: float | None = None
    """How long the backend took to tell its clock."""
    backend_error: str | None = None
    """Why the backend could not be reached (its exception, secrets masked, or
    ``no answer within <n> s``); None when it answered or was not asked."""
    loops: Mapping[str, bool] = field(default_factory=dict)
    """Each of the scheduler's loops and threads: alive or not."""
    loop_lag_ms: int | None = None
    """The event loop's delay at the watchdog's last probe (None without the scheduler's
    thread: a test clock)."""
    loop_blocked_ms: int | None = None
    """How long the event loop has been blocked now (0 when it runs)."""
    blocked_by: str | None = None
    """What blocks the event loop (the job and its handler), as the watchdog logged it."""
    clock_offset_ms: int | None = None
    """The backend's clock minus this host's, as last measured."""
    clock_budget_ms: int | None = None
    """The tightest skew budget of the jobs: past it a slot could run twice (None: unbounded)."""
    leases_held: int = 0
    """Runs of this instance holding a lease now."""
    running: int = 0
    """Runs of this instance now."""
    heartbeat_age_ms: int | None = None
    """Since this instance last recorded itself in the registry (None: never, or no registry)."""

    @property
    def status(self) -> str:
        """``ok``, ``degraded`` (healthy, with warnings) or ``failing``."""
        if not self.healthy:
            return "failing"
        return "degraded" if self.warnings else "ok"

    def as_dict(self) -> dict[str, Any]:
        """A plain dict (for JSON): the fields and ``status``."""
        out = asdict(self)
        out["loops"] = dict(self.loops)
        out["problems"], out["warnings"] = list(self.problems), list(self.warnings)
        return {"status": self.status, **out}


def healthz(
    scheduler: Scheduler, *, live: bool = False, timeout_s: float = DEFAULT_TIMEOUT_S
) -> tuple[int, bytes]:
    """Answer an HTTP health probe: ``(200, body)`` when ``scheduler`` is healthy (``live``:
    when it is live), else ``(503, body)``; the body is :meth:`Health.as_dict` as JSON.

    Call it from a thread other than the scheduler's event loop (an HTTP server's): it asks the
    loop for :meth:`Scheduler.health` and waits up to ``timeout_s``; a loop that does not answer
    by then is reported blocked (naming the handler that blocks it) without the backend's
    check. On the loop's own thread it reports what it can see without waiting."""
    health = _ask_loop(scheduler, timeout_s)
    ok = health.live if live else health.healthy
    body = json.dumps(health.as_dict(), separators=(",", ":")).encode()
    return (200 if ok else 503), body


# -- inside -------------------------------------------------------------------------------------


async def check(scheduler: Scheduler, timeout_s: float) -> Health:
    """:meth:`Scheduler.health`: the backend's clock asked (bounded), the rest looked at."""
    if (
        not isinstance(timeout_s, int | float)
        or isinstance(timeout_s, bool)
        or not 0 < timeout_s <= MAX_TIMEOUT_S  # NaN fails here too
    ):
        raise InvalidOption(
            f"timeout_s={timeout_s!r} must be a number of seconds above 0, at most {MAX_TIMEOUT_S}"
        )
    probe = await _probe(scheduler.backend, timeout_s) if scheduler.running else _NOT_ASKED
    return snapshot(scheduler, probe)


class _Probe(NamedTuple):
    """The backend's check (its clock asked): reached or not, in how many ms, and why not."""

    reachable: bool | None = None
    latency_ms: float | None = None
    error: str | None = None


_NOT_ASKED: Final = _Probe()


async def _probe(backend: Backend, timeout_s: float) -> _Probe:
    """Ask ``backend`` its clock, waiting at most ``timeout_s``."""
    began = time.perf_counter()
    reachable, error = True, None
    try:
        await asyncio.wait_for(backend.server_time_ms(), timeout_s)
    except TimeoutError:
        reachable, error = False, f"no answer within {timeout_s:g} s"
    except Exception as exc:
        reachable, error = False, redact_url(f"{type(exc).__name__}: {exc}")
    return _Probe(reachable, round((time.perf_counter() - began) * 1000, 1), error)


def snapshot(
    scheduler: Scheduler,
    probe: _Probe = _NOT_ASKED,
    *,
    unanswered_s: float | None = None,
    seen: Observation | None = None,
) -> Health:
    """What can be seen without the event loop (any thread), with the backend's check
    (``probe``) if made; ``unanswered_s``: the loop did not answer a probe within that long.
    ``seen``: the scheduler as just observed (default: observed now)."""
    problems: list[str] = []
    warnings: list[str] = []
    seen = seen or scheduler.observe()
    m = seen.metrics
    state = seen.state
    running = state == "running"
    if not running:
        problems.append(f"the scheduler is {state}, not running")
    loops = dict(seen.loops) if running else {}
    dead = sorted(name for name, alive in loops.items() if not alive)
    if dead:
        problems.append(f"loop(s) not running: {', '.join(dead)}")
    lag = blocked = None
    blocker = None
    if m.loop_lag_ms is not None and m.loop_blocked_ms is not None and running:
        lag, blocked, blocker = m.loop_lag_ms, m.loop_blocked_ms, seen.blocked_by
        if blocked >= BLOCK_WARN_MS:
            problems.append(f"the event loop has been blocked for {blocked} ms by {_by(blocker)}")
        elif lag >= BLOCK_WARN_MS:
            warnings.append(f"the event loop ran a probe {lag} ms late (it was blocked)")
    if unanswered_s is not None and not any("event loop" in p for p in problems):
        problems.append(
            f"the event loop did not answer within {unanswered_s:g} s (blocked by {_by(blocker)})"
        )
    reachable, latency_ms, error = probe
    if reachable is False:
        problems.append(f"the {scheduler.backend.name} backend cannot be reached: {error}")
    elif latency_ms is not None and latency_ms > SLOW_BACKEND_MS:
        warnings.append(f"the {scheduler.backend.name} backend took {latency_ms:g} ms to answer")
    offset = m.clock_offset_ms
    budget = m.clock_skew_budget_ms
    if offset is not None and budget is not None and abs(offset) > budget:
        problems.append(
            f"this host's clock is {offset:+d} ms off the backend's, past the skew budget of "
            f"{budget} ms: a slot could run twice (synchronise clocks: NTP)"
        )
    elif offset is not None and abs(offset) > max(min(5_000, (budget or 50_000) // 10), 250):
        warnings.append(f"this host's clock is {offset:+d} ms off the backend's")
    age = seen.heartbeat_age_ms
    if age is not None and age > STALE_HEARTBEATS * scheduler.heartbeat_ms and running:
        warnings.append(
            f"this instance last recorded itself in the registry {age} ms ago "
            f"(heartbeat_ms={scheduler.heartbeat_ms})"
        )
    shared = seen.shared_with
    if shared is not None and running:
        problems.append(
            f"instance id {scheduler.instance_id!r} is used by another process too ({shared}): "
            "they mix the ownership of their runs; give each process its own instance_id"
        )
    live = running and not dead and not any("event loop" in p for p in problems)
    return Health(
        healthy=not problems,
        live=live,
        problems=tuple(problems),
        warnings=tuple(warnings),
        instance=scheduler.instance_id,
        state=state,
        backend=scheduler.backend.name,
        backend_reachable=reachable,
        backend_latency_ms=latency_ms,
        backend_error=error,
        loops=loops,
        loop_lag_ms=lag,
        loop_blocked_ms=blocked,
        blocked_by=blocker,
        clock_offset_ms=offset,
        clock_budget_ms=budget,
        leases_held=seen.leases_held,
        running=m.running,
        heartbeat_age_ms=age,
    )


def _ask_loop(scheduler: Scheduler, timeout_s: float) -> Health:
    seen = scheduler.observe()
    loop = seen.event_loop
    if loop is None or loop.is_closed() or not scheduler.running:
        return snapshot(scheduler, seen=seen)
    if _loop_thread(loop) == threading.get_ident():
        return snapshot(scheduler, seen=seen)  # waiting here would block the loop it waits for
    future = asyncio.run_coroutine_threadsafe(check(scheduler, timeout_s), loop)
    try:
        return future.result(timeout_s * 2)  # the loop's answer includes the backend's wait
    except TimeoutError:
        future.cancel()
        return snapshot(scheduler, unanswered_s=timeout_s * 2)


def _loop_thread(loop: asyncio.AbstractEventLoop) -> int | None:
    return getattr(loop, "_thread_id", None)


def _by(blocker: str | None) -> str:
    return blocker or "code not yet named (the watchdog names it after 1 s)"
