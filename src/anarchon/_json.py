"""A run as every JSON output shows it: one builder, one spelling (docs/operations.md).

``anarchon history --json`` and ``jobs --json``, the attempts of ``anarchon explain --json``, the
record of ``anarchon cancel --json``, and the dashboard's JSON (a job's ``last_run``, ``running``
and ``runs``, a slot's ``attempts``) all show a :class:`~anarchon.Run` through
:func:`run_json`. Each output may add fields of its own beside these (the dashboard ``fate``,
explain ``retry``, ``jobs --json`` a running attempt's ``running_ms``); none spells one of
these another way.
"""

from __future__ import annotations

from typing import Any

from ._models import Run
from ._readable import ms_of
from ._redact import redact_url

__all__ = ["run_json"]


def run_json(run: Run, now_ms: int | None = None) -> dict[str, Any]:
    """``run`` as plain JSON values: times in epoch ms (``took_ms`` is ``finished_ms -
    started_ms``, None while it runs), enums as their text, and ``error`` and ``reason`` with
    every secret in a URL masked (as the logs and the dashboard show them). With ``now_ms``, a
    running attempt also has ``running_ms``: how long it has run then."""
    started = ms_of(run.started_at)
    finished = None if run.finished_at is None else ms_of(run.finished_at)
    out: dict[str, Any] = {
        "job": run.job,
        "run_id": run.run_id,
        "status": run.status.value,
        "trigger": run.trigger.value,
        "slot_ms": run.slot_ms,
        "started_ms": started,
        "finished_ms": finished,
        "took_ms": None if finished is None else finished - started,
        "instance": run.instance,
        "attempt": run.attempt,
        "fence": run.fence,
        "error": None if run.error is None else redact_url(run.error),
        "reason": None if run.reason is None else redact_url(run.reason),
        "requested_by": run.requested_by,
        "skip_cause": None if run.skip_cause is None else run.skip_cause.value,
    }
    if now_ms is not None and not run.status.finished:
        out["running_ms"] = now_ms - started
    return out
