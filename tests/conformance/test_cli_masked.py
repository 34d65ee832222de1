"""A secret in a URL of a run's error or reason, stored as it was given (the scheduler masks its
own; an earlier version or another writer may not have), is masked in the text ``anarchon
history`` and ``anarchon explain`` print, as their ``--json`` masks it (test_run_json.py). The
real commands, every option at its default, on every backend's real service."""

from __future__ import annotations

import json

import pytest

from tests.conformance.cli import (
    BACKENDS,
    JOB,
    SECRET,
    Shell,
    as_json,
    heartbeat,
    ok,
    store_secrets,
)
from tests.harness import Harness

pytestmark = pytest.mark.timeout(300)


@pytest.mark.parametrize("harness", BACKENDS, indirect=True)
async def test_history_and_explain_print_errors_and_reasons_masked(
    harness: Harness, shell: Shell
) -> None:
    # The text forms printed them as stored, password and all; only --json masked them.
    url, backend, slots = shell.url, shell.backend, shell.slots
    await store_secrets(backend, slots)
    failed, skipped = slots.unclaimed, slots.unclaimed + 1000

    history = ok(url, "history", JOB)
    assert SECRET not in history, history
    lines = history.splitlines()
    assert any(line.endswith("  cannot reach postgresql://app:***@db/x") for line in lines)
    assert any(line.endswith("  overlap: see redis://:***@cache") for line in lines), history

    for slot, said in (
        (failed, "    #1: cannot reach postgresql://app:***@db/x"),
        (skipped, "  reason: overlap: see redis://:***@cache"),
    ):
        await heartbeat(backend)  # w0 stays live (explain reads the job's schedule from it)
        text = ok(url, "explain", JOB, str(slot))
        assert SECRET not in text and said in text.splitlines(), text
        fate = as_json(url, "explain", JOB, str(slot))
        assert SECRET not in json.dumps(fate), fate
    assert fate["reason"] == "overlap: see redis://:***@cache", fate
