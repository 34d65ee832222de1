"""anarchon: leaderless distributed cron. Every slot of every job runs on exactly one instance.

Example::

    from anarchon import Scheduler

    scheduler = Scheduler()          # SQLite in ./anarchon.db: several processes on one host

    @scheduler.job("report", "0 6 * * MON-FRI", timezone="Europe/Athens")
    async def report(ctx):
        ...

    if __name__ == "__main__":
        scheduler.run()              # until SIGINT/SIGTERM; `anarchon run app:scheduler` too
"""

from __future__ import annotations

import importlib
import typing

# _early first: in the `anarchon` command it catches SIGINT and SIGTERM before the imports below,
# which take seconds on a loaded host (see its docstring).
from . import _early, errors  # noqa: F401
from ._context import RunContext
from ._job import Handler, JobKwargs, Timezone
from ._metrics import Histogram, JobMetrics, Metrics
from ._models import CatchUp, Overlap, Run, RunStatus, SkipCause, Trigger
from ._observation import Observation, ObservedState
from ._schedule import CronSchedule
from ._scheduler import LifeCycle, Scheduler
from ._urls import backend_from_url
from .backend import Backend, Capability, LeaseBackend
from .backends.memory import MemoryBackend
from .backends.sqlite import SQLiteBackend

if typing.TYPE_CHECKING:
    from .backends.nats import NatsBackend
    from .backends.postgres import PostgresBackend
    from .backends.redis import RedisBackend
from .errors import *  # noqa: F403  (every error: errors.__all__, re-exported below)
from .health import Health

__version__ = "0.1.0"

__all__ = [
    "Backend",
    "Capability",
    "CatchUp",
    "CronSchedule",
    "Handler",
    "Health",
    "Histogram",
    "JobKwargs",
    "JobMetrics",
    "LeaseBackend",
    "LifeCycle",
    "MemoryBackend",
    "Metrics",
    "NatsBackend",
    "Observation",
    "ObservedState",
    "Overlap",
    "PostgresBackend",
    "RedisBackend",
    "Run",
    "RunContext",
    "RunStatus",
    "SQLiteBackend",
    "Scheduler",
    "SkipCause",
    "Timezone",
    "Trigger",
    "__version__",
    "backend_from_url",
]
__all__ += errors.__all__
__all__.sort()  # one sorted list, as dir() shows it

# The network backends are imported when first named (``anarchon.NatsBackend``, ``from anarchon
# import RedisBackend``), not with the package: a process that uses one backend, or the
# `anarchon` command, does not load the other three (about a third of the package's import).
# Type checkers see the imports above instead (no module __getattr__ that would let any name
# through).
_LAZY: dict[str, str] = {
    "NatsBackend": ".backends.nats",
    "PostgresBackend": ".backends.postgres",
    "RedisBackend": ".backends.redis",
}

if not typing.TYPE_CHECKING:

    def __getattr__(name: str) -> object:
        """``NatsBackend``, ``PostgresBackend`` and ``RedisBackend``, imported on first use."""
        module = _LAZY.get(name)
        if module is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, __name__), name)
        globals()[name] = value
        return value

    def __dir__() -> list[str]:
        """The module's names, the backends not imported yet included."""
        return sorted({*globals(), *_LAZY})
