"""A retry survives its runner's process dying right after the failed result was recorded, on
every backend, with real processes.

Two :mod:`tests.conformance.steering_worker` processes (``--fleet crash``: ``flaky`` every two
seconds, failing its first run of a slot and succeeding on its retry, every option at its
default but ``retries=1``) run on one namespace. One of them exits (``os._exit``) as soon as a
call recording results returns a ``failed`` run: before this fix the retry was stored by a
second call after that one, so it was lost and the slot stayed ``failed`` with a retry left.
Now the backend stores the retry with the failed result, and the instance that runs on runs it,
exactly once.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conformance.steering_worker import EXIT_AFTER_FAILED_FINISH, EXIT_STATUS
from tests.conformance.test_steering_processes import (
    BACKENDS,
    Instances,
    history,
    instances,
    wait_for,
)
from tests.harness import Harness, Namespace

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

CRASH_WAIT_S = 30.0
"""The dying instance wins a slot and fails it this soon (slots every 2 s, about one in two)."""
RETRY_WAIT_S = 15.0
"""The retry starts this soon after the death (backoff at most 1 s, requests read every 1 s)."""
SETTLE_S = 3.0
"""After the retry started: long enough for a second start of it to show."""


@pytest.fixture
def crash(ns: Namespace, tmp_path: Path) -> Iterator[Instances]:
    with instances(ns, tmp_path, "crash") as made:
        yield made


def _retries(fleet: Instances, slot: int) -> list[dict[str, Any]]:
    return [r for r in fleet.records(job="flaky") if r["slot"] == slot and r["retry"] == 1]


@pytest.mark.parametrize("harness", BACKENDS, indirect=True)
def test_a_retry_survives_its_runner_dying_after_the_failed_result(
    harness: Harness, crash: Instances
) -> None:
    crash.spawn("stays", default_id=True)
    crash.spawn("dies", default_id=True, env={EXIT_AFTER_FAILED_FINISH: "1"})
    dying = crash.procs["dies"]
    wait_for(lambda: dying.poll() is not None, "the dying instance to fail a slot", CRASH_WAIT_S)
    assert dying.returncode == EXIT_STATUS, crash.logs()
    [gone] = crash.records("exit")
    died = time.monotonic()
    slot, run_id = gone["slot"], gone["run_id"]
    [first] = [r for r in crash.records(job="flaky") if r["run_id"] == run_id]
    assert first["retry"] == 0 and first["slot"] == slot, first

    wait_for(lambda: _retries(crash, slot), f"the retry of slot {slot}", RETRY_WAIT_S)
    print(f"{harness.name}: retry started {time.monotonic() - died:.1f} s after the death")
    time.sleep(SETTLE_S)
    [again] = _retries(crash, slot)
    assert again["trigger"] == "retry", again

    runs = [r for r in history(crash.url, "flaky") if r["slot_ms"] == slot]
    # The first run: scheduled, or the catch-up of a slot the dying instance found at its start.
    assert [(r["status"], r["trigger"] != "retry") for r in runs] == [
        ("failed", True),
        ("succeeded", False),
    ], runs
    assert runs[0]["run_id"] == run_id and runs[1]["run_id"] == again["run_id"], runs
