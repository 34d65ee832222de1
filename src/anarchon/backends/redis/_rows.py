"""What the scripts take and what they answer: requests as JSON arguments, answers as outcomes.

Every script takes one JSON object (``ARGV[1]``; a None value is left out, absent in Lua) and
answers one JSON object with the server's clock in ``now`` (see ``_common.lua``). The stored
attempt (``run`` in an answer, the records of ``history``) becomes the lease rules'
:class:`~anarchon.kit.lease.RunRow`, and from there a :class:`~anarchon.kit.Run` or a
:class:`~anarchon.backend.Ticket`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from json.encoder import encode_basestring_ascii as _quote
from typing import Any, Final

from ...backend import (
    ClaimNotice,
    ClaimOutcome,
    ClaimRequest,
    ClaimStatus,
    SkipCause,
    TakeoverOutcome,
    TakeoverRequest,
    Ticket,
)
from ...control import PAUSED_TRIGGERS
from ...errors import LeaseLost
from ...kit import Action, Run, RunStatus, log_fields
from ...kit.lease import (
    RunRow,
    answer_existing,
    existing_verdict,
    handed_over,
    lease_lost,
    lost_outcome,
    not_run,
    prune_ttl,
    skip_cause_of,
    stored_run,
    takeover_answer,
    won_outcome,
)
from . import _timings as timings

__all__ = [
    "ANNOUNCED_PER_MESSAGE",
    "CLAIMS_PER_CALL",
    "PRUNE_SCAN",
    "ClaimAnswer",
    "arguments",
    "change_messages",
    "claim_arguments",
    "claim_outcome",
    "held_fields",
    "lost",
    "notice_messages",
    "open_runs",
    "pauses_of",
    "prune_ttl",
    "run_row",
    "runs",
    "stored_run",
    "takeover_fields",
    "takeover_outcome",
    "text",
]

logger = logging.getLogger("anarchon.backends.redis")

# Pruning looks at most at this many history entries per result, so a finish stays a short
# script (it prunes at most PRUNE_BATCH slots, as every backend does).
PRUNE_SCAN: Final = 1_000
# Claims per call of the claim script on one server: one command instead of one per claim (the
# client's per-command work was most of a batch claim's CPU), short enough that a call holds
# the server for a few milliseconds at most, and that a call writes at most this many claims'
# records past maxmemory (see _common.lua).
CLAIMS_PER_CALL: Final = 50
# Claim notices (or finishes) announced per PUBLISH: a burst of 10 000 claims is 20 messages,
# each far under Redis's 512 MB limit and small enough for every subscriber to read at once.
ANNOUNCED_PER_MESSAGE: Final = 500
# Read once (an enum member read costs a lookup through EnumType's hook on Python 3.11).
_LOST: Final = ClaimStatus.LOST
# One claim's answer from the claim script: [now, fence] when won, else a JSON object.
ClaimAnswer = list[int] | dict[str, Any]
# The fields of a takeover request the take_over script reads, under the same names.
TAKEOVER_FIELDS: Final = ("slot_key", "run_id", "token", "instance", "lease_ms", "max_attempts")


# JSON without spaces, for what the scripts are sent and publish.
_compact: Final = json.JSONEncoder(separators=(",", ":")).encode


def text(value: Any) -> str:
    """A Redis reply (bytes or str) as text."""
    return value.decode() if isinstance(value, bytes) else str(value)


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


def arguments(values: dict[str, Any], clock_offset_ms: int = 0) -> str:
    """A script's arguments as JSON; None is left out (absent in Lua), and so is a zero
    test-only clock offset."""
    values = {**values, "clock_offset_ms": clock_offset_ms or None}
    return json.dumps({k: v for k, v in values.items() if v is not None})


def pauses_of(held: dict[str, str] | None, job: str) -> dict[str, str] | None:
    """The pauses a claim script on a cluster is given: its job's and every job's."""
    if held is None:
        return None
    return {name: held[name] for name in (job, "*") if name in held}


def claim_arguments(
    req: ClaimRequest,
    pauses: dict[str, str] | None = None,
    *,
    claims_channel: str | None = None,
    clock_offset_ms: int = 0,
) -> list[str]:
    """The claim script's arguments for ``req`` (see ``claim.lua``), absent values left out.

    1. What it decides by, under the request's names (enums go as their values):
       ``skip_status`` and ``skip_cause`` only with a ``skip_reason``, ``pausable`` when a
       pause holds its trigger back, and ``pauses`` (the stored pauses of its job and of every
       job) where the script cannot read them itself: a Redis Cluster (see ``_control``).
    2. The fields of the record it may store that the caller knows, as a JSON object left
       open for the script to complete, so that it encodes nothing.
    3. With ``claims_channel``: the claim notice it publishes if it wins, left open for the
       lease expiry.
    """
    # Both written out rather than encoded from dicts (the same text as _compact's): these
    # were every claim's largest cost in Python. Each text quoted once.
    job = _quote(req.job)
    key = _quote(req.slot_key)
    instance = _quote(req.instance)
    slot = req.slot
    decide = (
        f'{{"job":{job},"slot_key":{key},"lease_ms":{req.lease_ms:d},'
        f'"overlap":{_quote(req.overlap)},"restart_margin_ms":{timings.RESTART_MARGIN_MS:d}'
    )
    known = (
        f'{{"job":{job},"slot_key":{key},"attempt":1,"run_id":{_quote(req.run_id)},'
        f'"token":{_quote(req.token)},"instance":{instance},"trigger":{_quote(req.trigger)}'
    )
    if slot is not None:
        decide += f',"slot":{slot:d}'
        known += f',"slot":{slot:d}'
    if req.requested_by is not None:
        known += f',"requested_by":{_quote(req.requested_by)}'
    if req.skip_reason is not None:
        status = RunStatus(req.skip_status).value
        decide += f',"skip_reason":{_quote(req.skip_reason)},"skip_status":{_quote(status)}'
        if req.skip_cause is not None:
            decide += f',"skip_cause":{_quote(req.skip_cause)}'
    elif req.trigger in PAUSED_TRIGGERS:
        decide += ',"pausable":true'
        if pauses is not None:
            decide += f',"pauses":{_compact(pauses)}'
    if clock_offset_ms:
        decide += f',"clock_offset_ms":{clock_offset_ms:d}'
    if claims_channel is None:
        return [decide + "}", known]
    decide += f',"claims_channel":{_quote(claims_channel)}}}'
    return [decide, known, f"[{job},{key},{instance},"]


def takeover_fields(req: TakeoverRequest) -> dict[str, Any]:
    """What the take_over script reads of ``req``."""
    return {name: getattr(req, name) for name in TAKEOVER_FIELDS}


def held_fields(ticket: Ticket) -> dict[str, Any]:
    """What renew, release and finish check an attempt is still held by: slot, token, fence."""
    return {"slot_key": ticket.slot_key, "token": ticket.token, "fence": ticket.fence}


def run_row(data: dict[str, Any]) -> RunRow:
    """A stored attempt (JSON written by the scripts) as the lease rules' row."""
    return RunRow(
        job=data["job"],
        slot_key=data["slot_key"],
        slot=_opt_int(data.get("slot")),
        attempt=int(data["attempt"]),
        run_id=data["run_id"],
        token=data["token"],
        instance=data["instance"],
        trigger=data["trigger"],
        status=data["status"],
        fence=int(data.get("fence", 0)),
        started_at=int(data["started_at"]),
        finished_at=_opt_int(data.get("finished_at")),
        lease_expires_at=_opt_int(data.get("lease_expires_at")),
        released=bool(data.get("released", False)),
        error=data.get("error"),
        reason=data.get("reason"),
        requested_by=data.get("requested_by"),
        skip_cause=data.get("skip_cause"),
    )


def runs(records: list[Any]) -> list[Run]:
    """The history script's answer (stored records, newest first) as runs."""
    return [stored_run(json.loads(text(raw))) for raw in records]


def open_runs(answer: Any) -> list[Run]:
    """The open_runs script's answer (one JSON list of stored records) as runs."""
    return [stored_run(record) for record in json.loads(text(answer))]


def lost(ticket: Ticket, answer: dict[str, Any]) -> LeaseLost | None:
    """The :class:`LeaseLost` (the lease rules' wording) if the script refused ``ticket``."""
    refusal = answer.get("lost")
    if refusal is None:
        return None
    if refusal == "released":
        return handed_over(ticket)
    if refusal == "nobody":
        return lease_lost(ticket, None, None)
    return lease_lost(ticket, answer["attempt"], answer["status"])


def claim_outcome(req: ClaimRequest, answer: ClaimAnswer) -> ClaimOutcome:
    """The claim script's answer to ``req`` (see ``claim.lua``), by the lease rules:
    ``[now, fence]`` when it recorded attempt 1 running for ``req`` (the rest of the run and
    its ticket is the request's own); else ``{"now", "run"}``, from the attempt it found or
    recorded (skipped), or, with ``refused``, from the record it did not store. A slot refused
    because Redis lost its data before it is logged, since it will never run."""
    if isinstance(answer, list):
        now, fence = answer
        return won_outcome(req, now, fence)
    now = int(answer["now"])
    data = answer["run"]
    if "refused" in answer:
        return _refused(req, run_row(data), now)
    status = data["status"]
    attempt = int(data["attempt"])
    verdict = existing_verdict(req, status, attempt, data["token"], bool(data.get("released")))
    if verdict is not _LOST:  # skipped, or won again by a retry of the same token
        return answer_existing(run_row(data), req, now)
    expires = data.get("lease_expires_at")
    return lost_outcome(stored_run(data), status, None if expires is None else int(expires), now)


def _refused(req: ClaimRequest, row: RunRow, now: int) -> ClaimOutcome:
    if skip_cause_of(row.skip_cause, row.reason) is SkipCause.UNKNOWN:
        logger.warning(
            "job %s slot %s not run: %s",
            req.job,
            req.slot,
            row.reason,
            extra=log_fields(Action.CLAIM_REFUSED_UNKNOWN, req.job, req.slot),
        )
    return not_run(row, now)


def takeover_outcome(req: TakeoverRequest, answer: dict[str, Any]) -> TakeoverOutcome:
    """The take_over script's answer to ``req``, by the lease rules."""
    row = run_row(answer["run"]) if "run" in answer else None
    exhausted = answer["status"] == "exhausted"
    return takeover_answer(req, row, int(answer["now"]), exhausted=exhausted)


def _chunks(items: Sequence[list[Any]]) -> list[str]:
    return [
        _compact(items[at : at + ANNOUNCED_PER_MESSAGE])
        for at in range(0, len(items), ANNOUNCED_PER_MESSAGE)
    ]


def notice_messages(notices: Sequence[ClaimNotice]) -> list[str]:
    """Claim notices as ``<prefix>_claims`` messages: JSON lists of ``[job, slot_key,
    instance, lease_expires_at_ms]`` (:func:`anarchon.kit.feed.decode_notices` reads them)."""
    return _chunks([[n.job, n.slot_key, n.instance, n.lease_expires_at_ms] for n in notices])


def change_messages(finished: Sequence[tuple[str, str]]) -> list[str]:
    """Finished runs ``(job, slot_key)`` as ``<prefix>_changes`` messages: JSON lists of
    ``[job, slot_key, false]`` (a script's release or takeover publishes one such triple)."""
    return _chunks([[job, slot_key, False] for job, slot_key in finished])
