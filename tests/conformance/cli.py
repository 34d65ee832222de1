"""The ``anarchon`` commands as an operator runs them, for the conformance tests of the commands
(test_cli_steering.py, test_cli_requests.py, test_run_json.py): the real process on the test's
backend URL, and the records those tests read (:func:`populate`; the ``shell`` fixture of
conftest.py makes them)."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from anarchon import Backend, RunStatus, Trigger
from anarchon.backend import ClaimOutcome, ClaimRequest, ClaimStatus
from anarchon.registry import JobDefinition, record_instance
from tests.records import claim_request, instance_record

ROOT = Path(__file__).resolve().parents[2]
BACKENDS = ["sqlite", "postgres", "redis", "nats"]
MINUTE = 60_000
JOB = "sync"
DEFINITION = JobDefinition(
    name=JOB,
    expression="* * * * * *",
    zone="UTC",
    options={"jitter_ms": 0, "max_late_ms": 5000, "lease_ms": 15000},
)


def anarchon(url: str, *argv: str) -> subprocess.CompletedProcess[str]:
    """``anarchon ARGV --backend URL`` as a process."""
    return subprocess.run(
        [sys.executable, "-m", "anarchon", "--log-level", "WARNING", *argv, "--backend", url],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def ok(url: str, *argv: str) -> str:
    out = anarchon(url, *argv)
    assert out.returncode == 0, (argv, out.returncode, out.stdout, out.stderr)
    return out.stdout


def as_json(url: str, *argv: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(ok(url, *argv, "--json"))
    return data


class Slots:
    """Slots (every second) just before the backend's now: one ran, one skipped, one missed,
    one unclaimed; one ten minutes ahead; a moment between two slots."""

    def __init__(self, now_ms: int) -> None:
        second = now_ms - now_ms % 1000
        self.ran = second - 9000
        self.skipped = second - 8000
        self.missed = second - 7000
        self.unclaimed = second - 6000
        self.future = second + 10 * MINUTE
        self.not_a_slot = second - 9000 + 500


def claim(slot: int, **kw: Any) -> ClaimRequest:
    """A claim of the job's ``slot`` by w0 (run id ``run<slot>``)."""
    return ClaimRequest(
        job=JOB,
        slot=slot,
        run_id=f"run{slot}",
        token=f"token{slot}",
        instance="w0",
        trigger=Trigger.SCHEDULE,
        **kw,
    )


async def heartbeat(backend: Backend) -> int:
    """Record (again) instance w0 carrying the job, beating now; return now. Its heartbeat
    interval is a minute, so it stays live for 6 minutes: a test's many commands on a loaded
    machine take longer than 6 heartbeats of 5 s."""
    now = await backend.server_time_ms()
    assert now is not None
    registry = backend.registry()
    assert registry is not None
    await record_instance(registry, instance_record("w0", DEFINITION, beat=now, interval_ms=60_000))
    return now


async def populate(backend: Backend) -> Slots:
    """An instance record carrying the job, and the records of three slots."""
    slots = Slots(await heartbeat(backend))
    lease = 15000 if backend.is_lease_backend else 0
    [won] = await backend.claim([claim(slots.ran, lease_ms=lease)])
    assert won.status is ClaimStatus.WON and won.ticket is not None
    await backend.finish(won.ticket, "succeeded", None)
    [skip] = await backend.claim([claim(slots.skipped, skip_reason="too late: test")])
    assert skip.status is ClaimStatus.SKIPPED
    gap = "no instance carried the job from 10:00 to 10:05 (test)"
    [miss] = await backend.claim(
        [claim(slots.missed, skip_reason=gap, skip_status=RunStatus.MISSED)]
    )
    assert miss.status is ClaimStatus.SKIPPED
    return slots


@dataclass(frozen=True)
class Shell:
    """What a test of the commands starts from (the ``shell`` fixture): the backend's URL, the
    started backend, and the slots :func:`populate` recorded."""

    url: str
    backend: Backend
    slots: Slots


SECRET = "Hunter2pw"
"""The password in the texts :func:`store_secrets` stores."""


@dataclass(frozen=True)
class Secrets:
    """What :func:`store_secrets` recorded: a failed run and a skip, each a text holding
    :data:`SECRET` in a URL."""

    failed: ClaimOutcome
    skipped: ClaimOutcome


async def store_secrets(backend: Backend, slots: Slots) -> Secrets:
    """A failed run of ``slots.unclaimed`` and a skip of the slot after it, whose error and
    reason hold a password in a URL, stored as they were given (the scheduler masks its own; an
    earlier version or another writer may not have)."""
    lease = 15_000 if backend.is_lease_backend else 0
    [won] = await backend.claim([claim_request(JOB, slots.unclaimed, "w1", lease_ms=lease)])
    assert won.status is ClaimStatus.WON and won.ticket is not None
    await backend.finish(won.ticket, "failed", f"cannot reach postgresql://app:{SECRET}@db/x")
    skip = claim_request(JOB, slots.unclaimed + 1000, "w1", lease_ms=lease)
    reason = f"overlap: see redis://:{SECRET}@cache"
    [told] = await backend.claim([replace(skip, skip_reason=reason)])
    assert told.status is ClaimStatus.SKIPPED, told
    return Secrets(won, told)
