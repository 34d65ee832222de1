"""What anarchon logs, as a contract: the loggers, the actions and the fields of each record.

Every record about a decision carries an ``action`` (an :class:`Action`, a ``str``) and, where it
is about a slot or a run, the fields :func:`log_fields` builds: ``job``, ``slot`` (epoch ms,
None for a manual run) with ``slot_iso`` beside it, ``run_id``, ``attempt``, ``fence``. Filter on
them (``record.action == "lease_lost"``); the messages are for people and may change.

Loggers: :data:`SCHEDULER_LOGGER` (``anarchon.scheduler``) for the core, ``anarchon.job.<job>``
(:func:`job_logger`) for what a handler logs through ``ctx.logger``, and
``anarchon.backends.<name>`` (:func:`backend_logger`) for a backend. The table of actions is in
``docs/logging.md``.
"""

from __future__ import annotations

import logging
from enum import StrEnum
from types import EllipsisType
from typing import TYPE_CHECKING, Any, Final

from ._models import ms_to_datetime

if TYPE_CHECKING:
    from .backend import Ticket

__all__ = [
    "SCHEDULER_LOGGER",
    "Action",
    "backend_logger",
    "job_logger",
    "log_fields",
    "slot_iso",
]

#: The core's logger: claims, runs, leases, clocks, the life cycle.
SCHEDULER_LOGGER: Final = "anarchon.scheduler"


class Action(StrEnum):
    """Every ``action`` anarchon logs (``docs/logging.md`` gives each one's level and fields)."""

    # life cycle
    STARTED = "started"
    STOPPED = "stopped"
    STOP = "stop"
    INTERNAL_ERROR = "internal_error"
    LOOP_FAILED = "loop_failed"
    KEEPER = "keeper"
    KEEPER_THREAD = "keeper_thread"
    THREADS_ABANDONED = "threads_abandoned"
    # claims
    CLAIM_WON = "claim_won"
    CLAIM_LOST = "claim_lost"
    CLAIM_SKIPPED = "claim_skipped"
    CLAIM_REFUSED = "claim_refused"
    CLAIM_RETRY = "claim_retry"
    CLAIM_FAILED = "claim_failed"
    TOO_LATE = "too_late"
    NO_THREAD = "no_thread"
    SLOT_EARLY = "slot_early"
    BATCH_ITEM_FAILED = "batch_item_failed"
    CATCH_UP = "catch_up"
    CATCH_UP_FAILED = "catch_up_failed"
    SLOTS_MISSED = "slots_missed"
    # pauses, run requests, retries (anarchon.control)
    REQUEST_CLAIMED = "request_claimed"
    CONTROL_UNAVAILABLE = "control_unavailable"
    CONTROL_RECOVERED = "control_recovered"
    RETRY_SCHEDULED = "retry_scheduled"
    RETRY_FAILED = "retry_failed"
    FAILURE_HOOK = "failure_hook"
    FAILURE_HOOK_FAILED = "failure_hook_failed"
    # runs
    RUN_STARTED = "run_started"
    RUN_SUCCEEDED = "run_succeeded"
    RUN_FAILED = "run_failed"
    TIMED_OUT = "timed_out"
    FINISH_RETRY = "finish_retry"
    RESULT_REFUSED = "result_refused"
    RESULT_FAILED = "result_failed"
    CANCEL_IGNORED = "cancel_ignored"
    # leases, hand-over and takeover
    RENEW_FAILED = "renew_failed"
    LEASE_LOST = "lease_lost"
    HANDED_OVER = "handed_over"
    HANDOVER_FAILED = "handover_failed"
    LEFT_TO_BACKUP = "left_to_backup"
    LEFT_TO_EXPIRE = "left_to_expire"
    TAKEN_OVER = "taken_over"
    TAKEOVER_RETRY = "takeover_retry"
    ATTEMPTS_EXHAUSTED = "attempts_exhausted"
    # clocks and the event loop
    CLOCK_SKEW = "clock_skew"
    CLOCK_STEP = "clock_step"
    CLOCK_STEPPED = "clock_stepped"
    LOOP_BLOCKED = "loop_blocked"
    LOOP_UNBLOCKED = "loop_unblocked"
    # outages, the same for every backend
    BACKEND_UNAVAILABLE = "backend_unavailable"
    BACKEND_RECOVERED = "backend_recovered"
    NOTIFICATIONS_LOST = "notifications_lost"
    NOTIFICATIONS_RESUMED = "notifications_resumed"
    LISTENER_FAILED = "listener_failed"
    # the registry (anarchon.registry)
    DEFINITION_DRIFT = "definition_drift"
    INSTANCE_REMOVED = "instance_removed"
    REGISTRY_UNAVAILABLE = "registry_unavailable"
    REGISTRY_RECOVERED = "registry_recovered"
    # backends
    MIGRATED = "migrated"
    SQLITE_PATH = "sqlite_path"
    EVICTION_POLICY = "eviction_policy"
    CLAIM_REFUSED_UNKNOWN = "claim_refused_unknown"
    LISTEN = "listen"
    LISTEN_FAILED = "listen_failed"
    LISTEN_CALLBACK = "listen_callback"
    NOTIFY = "notify"
    SUBSCRIBED = "subscribed"
    SUBSCRIBE_RETRY = "subscribe_retry"
    NATS_ERROR = "nats_error"
    NATS_RETRY = "nats_retry"
    NATS_DISCONNECTED = "nats_disconnected"
    NATS_RECONNECTED = "nats_reconnected"
    CLAIM_DUPLICATE = "claim_duplicate"
    CLAIM_UNREAD = "claim_unread"
    CLAIM_SETTLED = "claim_settled"
    SETTLE_DROPPED = "settle_dropped"
    SETTLE_FAILED = "settle_failed"
    SETTLE_TOO_LATE = "settle_too_late"
    UPKEEP_FAILED = "upkeep_failed"
    WINDOW_RAISED = "window_raised"
    STREAM_CREATED = "stream_created"
    STREAM_UPDATED = "stream_updated"
    STREAM_MISSING = "stream_missing"
    STREAM_LIMIT_KEPT = "stream_limit_kept"
    STREAM_WINDOW_KEPT = "stream_window_kept"
    STREAM_FLOOR_SKEW = "stream_floor_skew"
    STREAM_FENCE_RESTART = "stream_fence_restart"


def slot_iso(slot: int | None) -> str | None:
    """A slot (epoch ms) as ISO 8601 in UTC with milliseconds, e.g.
    ``2026-01-01T06:00:00.000+00:00``; None stays None (a manual run has no slot)."""
    when = ms_to_datetime(slot)
    return None if when is None else when.isoformat(timespec="milliseconds")


def log_fields(
    action: Action,
    job: str | None = None,
    slot: int | EllipsisType | None = ...,
    *,
    ticket: Ticket | None = None,
    **more: Any,
) -> dict[str, Any]:
    """The ``extra`` of a record: ``action``; with a ``ticket``, its ``job``, ``slot``,
    ``slot_iso``, ``run_id``, ``attempt`` and ``fence``; else ``job`` and ``slot`` (with
    ``slot_iso``) when given (a ``slot`` of None: a manual run); then ``more`` (``holder``,
    ``reason``, ``offset_ms`` ...)."""
    fields: dict[str, Any] = {"action": action.value}
    if ticket is not None:
        fields.update(
            job=ticket.job,
            slot=ticket.slot,
            slot_iso=slot_iso(ticket.slot),
            run_id=ticket.run_id,
            attempt=ticket.attempt,
            fence=ticket.fence,
        )
    else:
        if job is not None:
            fields["job"] = job
        if not isinstance(slot, EllipsisType):
            fields["slot"] = slot
            fields["slot_iso"] = slot_iso(slot)
    fields.update(more)
    return fields


def job_logger(job: str) -> logging.Logger:
    """``anarchon.job.<job>``: the logger a handler gets as ``ctx.logger``."""
    return logging.getLogger(f"anarchon.job.{job}")


def backend_logger(name: str) -> logging.Logger:
    """``anarchon.backends.<name>``: the logger of the backend named ``name`` (``postgres``)."""
    return logging.getLogger(f"anarchon.backends.{name}")
