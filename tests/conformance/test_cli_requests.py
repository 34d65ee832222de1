"""``anarchon requests``, ``anarchon cancel`` and ``anarchon trigger``'s refusal of an unknown job,
as an operator runs them: the real ``anarchon`` process on every backend's real service
(docs/operations.md, "Pending run requests").

The registry record and the instance's claims are made in-process; the commands read and write
through the backend's URL.
"""

from __future__ import annotations

import json
import re

import pytest

from anarchon import Backend, SkipCause
from anarchon.backend import ClaimRequest, ClaimStatus
from anarchon.control import RunRequest
from tests.conformance.cli import BACKENDS, JOB, Shell, anarchon, as_json, ok
from tests.harness import Harness
from tests.records import waiting_retry

pytestmark = pytest.mark.timeout(300)

HEX32 = re.compile(r"[0-9a-f]{32}")


def _claim_of(backend: Backend, request: RunRequest) -> ClaimRequest:
    """Instance w1's claim of ``request``, as its request poller makes it."""
    return ClaimRequest(
        job=request.job,
        slot=request.slot,
        run_id=request.id,
        token="w1-token",
        instance="w1",
        trigger=request.trigger,
        lease_ms=15000 if backend.is_lease_backend else 0,
        key=request.key,
        requested_by=request.requested_by,
    )


@pytest.mark.parametrize("harness", BACKENDS, indirect=True)
async def test_list_and_cancel_requests(
    harness: Harness,
    shell: Shell,
) -> None:
    slots = shell.slots
    control = shell.backend.control()
    assert control is not None
    assert as_json(shell.url, "requests")["requests"] == []
    assert "no pending run requests in " in ok(shell.url, "requests")

    first = ok(shell.url, "trigger", JOB, "--by", "carol@ops").strip()
    second = ok(shell.url, "trigger", JOB).strip()
    assert HEX32.fullmatch(first) and HEX32.fullmatch(second)
    now = await shell.backend.server_time_ms()
    assert now is not None
    retry = waiting_retry(JOB, slots.ran, now, due_in_ms=600_000, request_id="f" * 32)
    assert await control.request(retry)

    listed = as_json(shell.url, "requests")
    assert [r["id"] for r in listed["requests"]][2] == retry.id, listed  # due first
    assert {r["id"] for r in listed["requests"]} == {first, second, retry.id}
    by_id = {r["id"]: r for r in listed["requests"]}
    assert by_id[first]["kind"] == "trigger" and by_id[first]["requested_by"] == "carol@ops"
    assert by_id[retry.id]["kind"] == "retry" and by_id[retry.id]["due_ms"] == now + 600_000
    assert by_id[retry.id]["requested_by"] == retry.requested_by
    assert isinstance(by_id[first]["requested_at_ms"], int)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", by_id[first]["requested_at"])
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", by_id[retry.id]["due_at"])
    table = ok(shell.url, "requests")
    for word in (first, second, retry.id, "trigger", "retry", "carol@ops", "in 9m"):
        assert word in table, (word, table)
    assert all(len(line) <= 100 for line in table.splitlines()), table
    assert as_json(shell.url, "requests", "--job", "other")["requests"] == []

    # One by its id: it leaves a skip record with who cancelled it, and is gone.
    said = ok(shell.url, "cancel", first, "--by", "bob@ops")
    assert said.strip() == f"cancelled trigger {first} of job 'sync' (asked by carol@ops)"
    again = anarchon(shell.url, "cancel", first)
    assert again.returncode == 3 and f"no pending run request {first}" in again.stderr, again
    [record] = [r for r in await shell.backend.history(JOB) if r.run_id == first]
    assert record.skip_cause is SkipCause.CANCELLED and record.reason == "cancelled by bob@ops"

    # Every one of the job: the second had been claimed by an instance first (it runs, exit 1),
    # the retry is cancelled.
    [pending] = [r for r in await control.requests() if r.id == second]
    [won] = await shell.backend.claim([_claim_of(shell.backend, pending)])
    assert won.status is ClaimStatus.WON
    out = anarchon(shell.url, "cancel", "--job", JOB, "--by", "bob@ops", "--json")
    assert out.returncode == 1, (out.returncode, out.stdout, out.stderr)
    answered = {r["id"]: r for r in json.loads(out.stdout)["requests"]}
    assert answered[second]["cancelled"] is False
    assert answered[second]["run"]["instance"] == "w1"
    assert answered[second]["run"]["status"] == "running"
    assert answered[retry.id]["cancelled"] is True and answered[retry.id]["kind"] == "retry"
    assert answered[retry.id]["run"]["skip_cause"] == "cancelled"
    assert as_json(shell.url, "requests")["requests"] == []
    none = ok(shell.url, "cancel", "--job", JOB)
    assert none.strip().startswith("no pending run requests of job 'sync'"), none


@pytest.mark.parametrize("harness", BACKENDS, indirect=True)
async def test_cancel_refuses_a_bad_command_line(
    harness: Harness,
    shell: Shell,
) -> None:
    """Exit 2 with one line naming the value and the rule, before the backend is opened."""
    for argv, said in (
        (("cancel",), "give a request ID or --job JOB"),
        (("cancel", "a" * 32, "--job", JOB), "give a request ID or --job JOB"),
        (("cancel", "NOT-HEX"), "request id 'NOT-HEX' is not 32 lowercase hex digits"),
        (("cancel", "--job", "a b"), "anarchon cancel: "),
        (("cancel", "--job", JOB, "--by", ""), "anarchon cancel: --by"),
        (("requests", "--job", "a b"), "anarchon requests: "),
    ):
        out = anarchon(shell.url, *argv)
        assert out.returncode == 2, (argv, out.returncode, out.stdout, out.stderr)
        assert said in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr


@pytest.mark.parametrize("harness", BACKENDS, indirect=True)
async def test_trigger_refuses_a_job_no_instance_carries(
    harness: Harness,
    shell: Shell,
) -> None:
    """A typo is refused (exit 2, nothing stored), with the job's name, the rule and a close
    match; ``--force`` stores it as before, with the warning."""
    control = shell.backend.control()
    assert control is not None
    out = anarchon(shell.url, "trigger", "synk")
    assert out.returncode == 2, (out.returncode, out.stdout, out.stderr)
    assert "no instance in the registry carries job 'synk' (did you mean 'sync'?)" in out.stderr
    assert "--force stores it anyway" in out.stderr and out.stdout == ""
    out = anarchon(shell.url, "trigger", "nosuchjob")
    assert out.returncode == 2 and "job 'nosuchjob':" in out.stderr, out.stderr
    assert await control.requests() == []
    forced = anarchon(shell.url, "trigger", "nosuchjob", "--force")
    assert forced.returncode == 0, (forced.stdout, forced.stderr)
    assert "no live instance carries job 'nosuchjob'" in forced.stderr
    [stored] = await control.requests()
    assert (stored.id, stored.job) == (forced.stdout.strip(), "nosuchjob")
