"""One JSON shape of a run (docs/operations.md): ``anarchon history --json`` and ``jobs --json``,
each attempt of ``anarchon explain --json``, the record of ``anarchon cancel --json`` and the
dashboard's JSON (a job's ``runs`` and ``last_run``, a slot's ``attempts``) spell the same run
alike, each adding only its own fields. The real ``anarchon`` commands and ``anarchon
dashboard``, every option at its default, on every backend's real service."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.conformance.cli import BACKENDS, JOB, SECRET, Shell, as_json, heartbeat, store_secrets
from tests.harness import Harness
from tests.web.cluster import Cluster

pytestmark = pytest.mark.timeout(300)

#: The fields of a run, as docs/operations.md lists them for ``history --json``.
FIELDS = {
    "job",
    "run_id",
    "status",
    "trigger",
    "slot_ms",
    "started_ms",
    "finished_ms",
    "took_ms",
    "instance",
    "attempt",
    "fence",
    "error",
    "reason",
    "requested_by",
    "skip_cause",
}
#: What each output adds to a run of its own.
EXTRAS = {"explain": {"retry"}, "dashboard": {"fate"}, "cancel": set(), "jobs": set()}


def _run_of(shown: dict[str, Any], where: str) -> dict[str, Any]:
    """``shown`` without the fields ``where`` adds of its own (they must be there)."""
    extra = EXTRAS[where]
    assert extra <= set(shown), (where, shown)
    return {k: v for k, v in shown.items() if k not in extra}


def _dashboard(base: str, page: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{base}{page}?format=json", timeout=30) as response:
        assert response.status == 200, page
        data: dict[str, Any] = json.loads(response.read())
        return data


@pytest.mark.parametrize("harness", BACKENDS, indirect=True)
async def test_the_cli_the_dashboard_and_explain_give_one_json_for_a_run(
    harness: Harness, shell: Shell, tmp_path: Path
) -> None:
    # The copies disagreed: history, jobs and explain had no `job`, explain's attempts no
    # `slot_ms`, cancel's `run` five fields; history, jobs, explain and cancel printed a secret
    # in an error or a reason as it was stored, the dashboard masked it.
    url, backend, slots = shell.url, shell.backend, shell.slots
    secrets = await store_secrets(backend, slots)
    won, told = secrets.failed, secrets.skipped
    failed, skipped = slots.unclaimed, slots.unclaimed + 1000

    seen: dict[str, list[dict[str, Any]]] = {}  # run id: each output's spelling of the run
    for slot in (slots.ran, slots.skipped, slots.missed, failed, skipped):
        await heartbeat(backend)  # w0 stays live (explain and jobs read the live instances)
        for attempt in as_json(url, "explain", JOB, str(slot))["attempts"]:
            seen.setdefault(attempt["run_id"], []).append(_run_of(attempt, "explain"))
    await heartbeat(backend)
    [job] = as_json(url, "jobs")["jobs"]
    last = _run_of(job["last_run"], "jobs")
    seen.setdefault(last["run_id"], []).append(last)

    request = as_json(url, "trigger", JOB)
    cancel = as_json(url, "cancel", request["id"], "--by", "bob@ops")
    [cancelled] = cancel["requests"]
    assert cancelled["cancelled"] is True, cancelled
    seen.setdefault(request["id"], []).append(_run_of(cancelled["run"], "cancel"))

    history = as_json(url, "history", JOB)["runs"]
    assert len(history) == 6, history  # ran, skipped, missed, failed, skipped, cancelled

    board = Cluster(url, tmp_path)
    try:
        board.serve(token=None)
        page = _dashboard(board.base, f"/jobs/{JOB}")
        for run in page["runs"]:
            seen.setdefault(run["run_id"], []).append(_run_of(run, "dashboard"))
        for slot in (failed, skipped):
            for attempt in _dashboard(board.base, f"/jobs/{JOB}/slots/{slot}")["attempts"]:
                seen.setdefault(attempt["run_id"], []).append(_run_of(attempt, "dashboard"))
    finally:
        board.stop()

    for run in history:
        assert set(run) == FIELDS, run  # the documented fields, no more
        assert run["job"] == JOB
        if run["finished_ms"] is not None:
            assert run["took_ms"] == run["finished_ms"] - run["started_ms"], run
        views = seen.get(run["run_id"], [])
        assert len(views) >= 2, (run, views)  # explain or cancel, and the dashboard
        for view in views:
            if view is seen[run["run_id"]][0] and run["trigger"] == "manual":
                # cancel's record is the claim's answer: on NATS its times are the claim's
                # own, taken before the store kept the record's (1 ms apart on a quiet machine,
                # 2 ms seen under load: the bound is for a wrong record, not for a slow host).
                for key in ("started_ms", "finished_ms"):
                    assert abs(view[key] - run[key]) <= 250, (view, run)
                    view = {**view, key: run[key]}
            assert view == run, (view, run)
    by_id = {r["run_id"]: r for r in history}
    assert by_id[won.run.run_id]["error"] == "cannot reach postgresql://app:***@db/x"
    assert by_id[told.run.run_id]["reason"] == "overlap: see redis://:***@cache"
    everything = json.dumps([history, seen, job, cancel])
    assert SECRET not in everything
