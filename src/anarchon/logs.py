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

import json
import logging
from contextvars import ContextVar
from datetime import UTC, datetime
from enum import StrEnum
from types import EllipsisType
from typing import TYPE_CHECKING, Any, Final

from ._models import ms_to_datetime
from ._redact import redact_url

if TYPE_CHECKING:
    from .backend import Ticket

__all__ = [
    "JSON_FIELDS",
    "SCHEDULER_LOGGER",
    "Action",
    "JsonFormatter",
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
    START_FAILED = "start_failed"
    START_CANCELLED = "start_cancelled"
    STOPPED = "stopped"
    STOP = "stop"
    SIGNAL = "signal"
    GRACE_CUT_SHORT = "grace_cut_short"
    LOOP_ENDED = "loop_ended"
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
    CLAIM_HEARD = "claim_heard"
    CLAIM_FAILED = "claim_failed"
    TOO_LATE = "too_late"
    CLAIMS_TOO_LATE = "claims_too_late"
    BEHIND = "behind"
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
    RETRY_FAILED = "retry_failed"  # no longer logged: a retry is stored with its result
    FAILURE_HOOK = "failure_hook"
    FAILURE_HOOK_FAILED = "failure_hook_failed"
    # runs
    RUN_STARTED = "run_started"
    RUN_SUCCEEDED = "run_succeeded"
    RUN_FAILED = "run_failed"
    TIMED_OUT = "timed_out"
    FINISH_RETRY = "finish_retry"
    FINISH_RECOVERED = "finish_recovered"
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
    THREADS_LEFT = "threads_left"
    TAKEN_OVER = "taken_over"
    TAKEOVER_RETRY = "takeover_retry"
    RUNS_ADOPTED = "runs_adopted"
    ADOPT_FAILED = "adopt_failed"
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
    CLAIM_NOTICE_MALFORMED = "claim_notice_malformed"
    CLAIM_NOTICES_REFUSED = "claim_notices_refused"
    # the registry (anarchon.registry)
    DEFINITION_DRIFT = "definition_drift"
    INSTANCE_REMOVED = "instance_removed"
    INSTANCE_ID_SHARED = "instance_id_shared"
    INSTANCE_ID_SHARED_ENDED = "instance_id_shared_ended"
    REGISTRY_UNAVAILABLE = "registry_unavailable"
    REGISTRY_RECOVERED = "registry_recovered"
    DEFINITIONS_MISSING = "definitions_missing"
    # backends
    MIGRATED = "migrated"
    SQLITE_PATH = "sqlite_path"
    EVICTION_POLICY = "eviction_policy"
    CLAIM_REFUSED_UNKNOWN = "claim_refused_unknown"
    CLAIMS_FEED = "claims_feed"
    LIBPQ_OLD = "libpq_old"
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
    WINDOW_RAISE_FAILED = "window_raise_failed"
    STREAM_CREATED = "stream_created"
    STREAM_UPDATED = "stream_updated"
    STREAM_MISSING = "stream_missing"
    STREAM_RECREATED = "stream_recreated"
    STREAM_FOUND = "stream_found"
    STREAM_LIMIT_KEPT = "stream_limit_kept"
    STREAM_WINDOW_KEPT = "stream_window_kept"
    STREAM_FLOOR_SKEW = "stream_floor_skew"
    STREAM_FENCE_RESTART = "stream_fence_restart"
    BUCKET_UPDATED = "bucket_updated"
    BUCKET_UPDATE_FAILED = "bucket_update_failed"
    BUCKET_RECREATED = "bucket_recreated"
    # the metrics server of ``anarchon run --metrics-port`` (anarchon.http)
    HTTP_SERVING = "http_serving"
    HTTP_STOPPED = "http_stopped"
    HTTP_LINGER = "http_linger"
    HTTP_ROUTE_FAILED = "http_route_failed"


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
    ``slot_iso``, ``run_id``, ``attempt``, ``fence`` and ``instance`` (the one running it);
    else ``job`` and ``slot`` (with ``slot_iso``) when given (a ``slot`` of None: a manual
    run); then ``more`` (``holder``, ``reason``, ``offset_ms`` ...)."""
    if ticket is not None:
        job, slot = ticket.job, ticket.slot
    fields: dict[str, Any] = {"action": action.value}
    if job is not None:
        fields["job"] = job
    if not isinstance(slot, EllipsisType):
        fields["slot"] = slot
        fields["slot_iso"] = slot_iso(slot)
    if ticket is not None:
        fields.update(
            run_id=ticket.run_id,
            attempt=ticket.attempt,
            fence=ticket.fence,
            instance=ticket.instance,
        )
    fields.update(more)
    return fields


def job_logger(job: str) -> logging.Logger:
    """``anarchon.job.<job>``: the logger a handler gets as ``ctx.logger``."""
    return logging.getLogger(f"anarchon.job.{job}")


def backend_logger(name: str) -> logging.Logger:
    """``anarchon.backends.<name>``: the logger of the backend named ``name`` (``postgres``)."""
    return logging.getLogger(f"anarchon.backends.{name}")


# -- JSON lines ---------------------------------------------------------------------------------

# The instance a record is about when the record does not say: the scheduler whose task logs it
# (set when it starts, inherited by its tasks and its handlers' threads), else the scheduler
# that started last in this process (its own threads: the lease keeper, the loop watchdog).
_INSTANCE: ContextVar[str | None] = ContextVar("anarchon_instance", default=None)
_LAST_INSTANCE: list[str | None] = [None]
# The attributes every LogRecord has; anything else on a record came from ``extra=``.
_STANDARD: Final = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime"}
#: The contract's fields, first in every line (when the record has them), in this order.
JSON_FIELDS: Final = ("action", "job", "slot", "slot_iso", "run_id", "attempt", "fence", "instance")


def bind_instance(instance: str) -> None:
    """Name ``instance`` as the one this task (and the tasks it starts) logs for; called by the
    scheduler when it starts."""
    _INSTANCE.set(instance)
    _LAST_INSTANCE[0] = instance


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line: ``time`` (ISO 8601, UTC, milliseconds),
    ``level``, ``logger``, ``message``; then the contract's fields the record has (``action``,
    ``job``, ``slot`` in epoch ms and ``slot_iso``, ``run_id``, ``attempt``, ``fence``) and
    ``instance``; then any other field given through ``extra``; and for a record with an
    exception, ``traceback``. Secrets in URLs are masked, as in every anarchon message.

    ``anarchon run --log-format json`` uses it; in a ``dictConfig``, name it as a formatter's
    ``"()": "anarchon.logs.JsonFormatter"``. ``instance`` names the instance for records that
    do not say (default: the scheduler that logs, as set when it starts)."""

    def __init__(self, instance: str | None = None) -> None:
        super().__init__()
        if instance is not None and not isinstance(instance, str):
            raise TypeError(f"instance={instance!r} must be a string or None")
        self.instance = instance

    def format(self, record: logging.LogRecord) -> str:
        """The record as one line of JSON."""
        fields = {k: v for k, v in vars(record).items() if k not in _STANDARD}
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": redact_url(record.getMessage()),
        }
        slot = fields.get("slot")
        if isinstance(slot, str):  # ctx.logger gives the slot in ISO: give both, as elsewhere
            ms = _ms_of(slot)
            fields["slot"], fields["slot_iso"] = ms, slot if ms is None else slot_iso(ms)
        instance = fields.get("instance") or self.instance or _INSTANCE.get() or _LAST_INSTANCE[0]
        if instance is not None:  # None: logged before any scheduler started
            fields["instance"] = instance
        for name in JSON_FIELDS:
            if name in fields:
                out[name] = fields.pop(name)
        out.update((k, redact_url(v) if isinstance(v, str) else v) for k, v in fields.items())
        if record.exc_info:
            out["traceback"] = redact_url(self.formatException(record.exc_info))
        elif record.exc_text:
            out["traceback"] = redact_url(record.exc_text)
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, default=str, ensure_ascii=False)


def _ms_of(iso: str) -> int | None:
    try:
        return round(datetime.fromisoformat(iso).timestamp() * 1000)
    except ValueError:
        return None
