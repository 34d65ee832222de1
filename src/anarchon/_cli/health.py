"""``anarchon health``: from outside the process, is this host's scheduler well? For a
Kubernetes exec probe: the backend answers, and each instance on this host (or the one named)
recorded itself in the registry recently with its clock within the jobs' skew budget. A stale
record of this host whose process no longer runs (a worker killed with SIGKILL, its record not
yet removed) is shown ``gone`` and does not fail the host (see :func:`_leave_out_the_gone`).

Exit codes: 0 healthy; 1 unhealthy (no live instance here, a stale heartbeat, a clock past
its budget); 3 no anarchon data where the backend points; 4 the backend cannot be reached. With
``--json`` each of them prints one JSON object on stdout, ``{"healthy": false, "status":
"failing", "problems": [why]}`` for 3 and 4; a bad command line (2) prints only its error.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import time
from pathlib import Path
from typing import Any, Final

from .._models import Overlap
from .._options import check_label
from .._readable import span
from .._redact import redact_url
from .._scheduler import MAX_INSTANCE_ID
from ..backend import Backend, JobPolicy
from ..errors import BackendError, ConfigurationError
from ..health import STALE_HEARTBEATS
from ..registry import InstanceRecord, JobDefinition, read_instances
from ..steering import backend_now_ms
from .common import EXIT_BACKEND, EXIT_FAILED, EXIT_OK, EXIT_USAGE, Exit, opened, where
from .output import say, shown

#: How long the backend may take to answer, in all (s).
TIMEOUT_S: Final = 5.0
_POLICY_FIELDS: Final = (
    "jitter_ms",
    "max_late_ms",
    "lease_ms",
    "max_attempts",
    "catch_up",
    "catch_up_window_ms",
    "handover",
    "history_ttl_ms",
)


async def health(args: argparse.Namespace) -> int:
    """``anarchon health [--backend URL] [--instance ID] [--json]``."""
    if args.instance is not None:
        # Checked before the backend is opened, by the rule of Scheduler(instance_id=...): no
        # instance can have a bad id, so it is a bad command line, not a backend down (4) or
        # an unhealthy host (1).
        try:
            check_label("--instance", args.instance, MAX_INSTANCE_ID)
        except ConfigurationError as exc:
            raise Exit(EXIT_USAGE, f"anarchon health: {exc}") from None
    host = socket.gethostname()
    try:
        async with asyncio.timeout(args.timeout):
            report = await _check(args.backend, args.instance, host)
    except (BackendError, TimeoutError) as exc:
        text = f"no answer within {args.timeout:g} s" if isinstance(exc, TimeoutError) else exc
        message = redact_url(" ".join(f"the backend cannot be reached: {text}".split()))
        raise _failing(args, Exit(EXIT_BACKEND, f"anarchon health: {message}"), message) from None
    except Exit as exc:
        if exc.code == EXIT_USAGE:
            raise  # a bad command line: a backend that keeps no registry
        raise _failing(args, exc, str(exc)) from None  # no anarchon data there
    healthy = not report["problems"]
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        latency = report["backend_latency_ms"]
        say(f"{report['status']}: {report['backend']} answered in {latency:g} ms")
        for instance in report["instances"]:
            offset = instance["clock_offset_ms"]
            gone = f" (gone: pid {instance['pid']} no longer runs)" if instance["gone"] else ""
            say(
                f"  {shown(instance['id'])}: heartbeat {span(instance['heartbeat_age_ms'])} ago, "
                f"clock offset {'-' if offset is None else f'{offset:+d}ms'}{gone}"
            )
        for problem in report["problems"]:
            say(f"  problem: {shown(problem)}")
    return EXIT_OK if healthy else EXIT_FAILED


def _failing(args: argparse.Namespace, leave: Exit, problem: str) -> Exit:
    """``leave``, once ``--json`` printed the failing report: whatever a backend answers (or
    its silence), ``--json`` prints one JSON object on stdout, alike on every backend."""
    if args.json:
        print(json.dumps({"healthy": False, "status": "failing", "problems": [problem]}, indent=2))
    return leave


async def _check(url: str | None, instance_id: str | None, host: str) -> dict[str, Any]:
    async with opened(url, registry=True) as backend:
        began = time.perf_counter()
        await backend.server_time_ms()
        latency = round((time.perf_counter() - began) * 1000, 1)
        store = backend.registry()
        assert store is not None  # opened() checked it
        now = await backend_now_ms(backend)
        records = await read_instances(store)
        name = where(backend)
        if instance_id is not None:
            mine = [r for r in records if r.id == instance_id]
            missing = f"no live instance {instance_id!r} in the registry"
        else:
            mine = [r for r in records if r.host == host]
            missing = f"no live instance on host {host!r} in the registry"
        instances = [_instance(backend, r, now) for r in mine]
    if instance_id is None:
        _leave_out_the_gone(instances)
    live = [i for i in instances if not i["gone"]]
    problems = [p for i in live for p in i["problems"]] or ([] if live else [missing])
    return {
        "healthy": not problems,
        "status": "ok" if not problems else "failing",
        "backend": name,
        "backend_latency_ms": latency,
        "host": host,
        "now_ms": now,
        "instances": instances,
        "problems": problems,
    }


def _instance(backend: Backend, record: InstanceRecord, now_ms: int) -> dict[str, Any]:
    problems: list[str] = []
    heartbeat_age = max(0, now_ms - record.heartbeat_ms)
    if heartbeat_age > STALE_HEARTBEATS * record.interval_ms:
        problems.append(
            f"instance {record.id} last recorded itself {heartbeat_age} ms ago (every "
            f"{record.interval_ms} ms): its event loop is blocked or the process is gone"
        )
    if record.shared_with is not None:
        problems.append(
            f"instance id {record.id!r} is used by two processes ({record.host} pid "
            f"{record.pid} and {record.shared_with}): give each its own instance_id"
        )
    budgets = [b for j in record.jobs if (b := _budget(backend, j)) is not None]
    budget = min(budgets) if budgets else None
    offset = record.clock_offset_ms
    if offset is not None and budget is not None and abs(offset) > budget:
        problems.append(
            f"instance {record.id}'s clock is {offset:+d} ms off the backend's, past the skew "
            f"budget of {budget} ms: a slot could run twice (synchronise clocks: NTP)"
        )
    return {
        "id": record.id,
        "pid": record.pid,
        "heartbeat_age_ms": heartbeat_age,
        "interval_ms": record.interval_ms,
        "clock_offset_ms": offset,
        "clock_budget_ms": budget,
        "healthy": not problems,
        "problems": problems,
        "gone": False,
    }


def _leave_out_the_gone(instances: list[dict[str, Any]]) -> None:
    """Mark ``gone`` the stale records of this host whose process no longer runs (a worker
    killed with SIGKILL, which its master replaced): their records wait for the next live
    heartbeat to remove them, and the host's health is its live schedulers'.

    Judged by process id only where this probe sees the processes of the fresh records (the
    same PID namespace: an exec probe in the scheduler's container); otherwise, or with no fresh
    record at all, every stale record stays a problem. A blocked event loop leaves its process
    running, so its stale record stays a problem too."""
    fresh = [i for i in instances if not _stale(i)]
    if os.name != "posix" or not fresh or not all(_running(i["pid"]) for i in fresh):
        return
    for instance in instances:
        if _stale(instance) and not _running(instance["pid"]):
            instance["gone"] = True


def _stale(instance: dict[str, Any]) -> bool:
    return bool(instance["heartbeat_age_ms"] > STALE_HEARTBEATS * instance["interval_ms"])


def _running(pid: int) -> bool:
    """Whether process ``pid`` runs here (a zombie, killed and not yet reaped, does not)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # it runs, as another user's process
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state not in ("Z", "X")


def _budget(backend: Backend, job: JobDefinition) -> int | None:
    """The job's skew budget on this backend, from its recorded options (None if unknown)."""
    options = job.options
    try:
        policy = JobPolicy(
            name=job.name,
            overlap=Overlap(str(options["overlap"])),
            **{k: options[k] for k in _POLICY_FIELDS},  # type: ignore[arg-type]
        )
        return backend.skew_budget_ms(policy)
    except (AttributeError, KeyError, TypeError, ValueError):
        return None
