"""Between anarchon's types and ``queries.sql``: the parameters each statement takes, and the
rows it answers with turned into runs, tickets and outcomes.

A statement answers with the columns of ``run_columns`` (a :class:`RunRow`, NULL when there is
no record) beside what it decided (``verdict``, ``now``, ``ours`` ...); the answers are built
by the shared lease rules (:mod:`anarchon.kit.lease`), so they are the other backends' answers.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import fields
from typing import Any, Final

from anarchon.backend import (
    ClaimNotice,
    ClaimOutcome,
    ClaimRequest,
    FinishRequest,
    SlotRecords,
    TakeoverOutcome,
    TakeoverRequest,
    Ticket,
)
from anarchon.control import PAUSED_TRIGGERS, RunRequest
from anarchon.errors import BackendUnavailable, LeaseLost
from anarchon.kit import Overlap, Run, RunStatus
from anarchon.kit.feed import encode_notice
from anarchon.kit.lease import (
    PRUNE_BATCH,
    RunRow,
    already_recorded,
    answer_existing,
    handed_over,
    lease_lost,
    peek_answer,
    prune_ttl,
    pruned_outcome,
    takeover_answer,
)

__all__ = [
    "claim_batch_params",
    "claim_notice",
    "claim_one_params",
    "claim_outcome",
    "claim_params",
    "finish_params",
    "finished",
    "peeked_takeover",
    "released_or_lost",
    "renewed",
    "retry_params",
    "runs",
    "slot_records",
    "takeover_outcome",
    "takeover_params",
    "ticket_params",
    "without_repeats",
    "won_any",
]

# What ``run_columns`` in queries.sql selects: the lease rules' RunRow, field by field. A skip
# record stored without a cause (NULL: before schema version 5, or by an older instance) reads
# the one its reason's words say (kit.lease.skip_cause_of, the compatibility path).
_RUN_COLUMNS: Final = tuple(f.name for f in fields(RunRow))
# A retry's fields (RunRequest.to_dict) and the finish statement's parameters that carry them.
_RETRY_FIELDS: Final = tuple(f.name for f in fields(RunRequest))
_RETRY_PARAMS: Final = {
    name: "retry_number" if name == "retry" else f"retry_{name}" for name in _RETRY_FIELDS
}

# -- parameters -----------------------------------------------------------------------------


# The fields of a claim request as the claim statements take them, in _claim_values' order.
_CLAIM_FIELDS: Final = (
    "job",
    "slot_key",
    "slot",
    "run_id",
    "token",
    "instance",
    "trigger",
    "lease_ms",
    "overlap_skip",
    "skip_reason",
    "skip_status",
    "pausable",
    "requested_by",
    "skip_cause",
)


def _claim_values(r: ClaimRequest) -> tuple[Any, ...]:
    """One request's values, field by field (:data:`_CLAIM_FIELDS`)."""
    return (
        r.job,
        r.slot_key,
        r.slot,
        r.run_id,
        r.token,
        r.instance,
        str(r.trigger),
        r.lease_ms,
        r.overlap is Overlap.SKIP,
        r.skip_reason,
        str(RunStatus(r.skip_status)),
        # Whether a pause may hold the request (the statement looks the pause up itself).
        r.skip_reason is None and r.trigger in PAUSED_TRIGGERS,
        r.requested_by,
        # The cause stored with skip_reason (SkipCause's text); None for none.
        None if r.skip_cause is None else r.skip_cause.value,
    )


def claim_params(reqs: Sequence[ClaimRequest], channel: str, *, later: bool) -> dict[str, Any]:
    """``claim_decide``'s parameters (the claim function's arguments): one array per field, a
    request per index, the ``channel`` its claim notices go to, and whether they are kept for
    ``send_notices`` (``later``) instead of sent at commit."""
    columns = zip(*map(_claim_values, reqs), strict=True) if reqs else [()] * len(_CLAIM_FIELDS)
    params: dict[str, Any] = {"channel": channel, "later": later}
    params.update(zip(_CLAIM_FIELDS, map(list, columns), strict=True))
    return params


def claim_batch_params(
    reqs: Sequence[ClaimRequest], channel: str, *, later: bool
) -> dict[str, Any]:
    """The ``claim`` statement's parameters: :func:`claim_params` as one JSON object, an array
    per field, which the statement reads into the function's arrays. One string encodes in a
    few microseconds; thirteen arrays of a batch of 17 took the driver 160-280 us of CPU (each
    string element checked for quoting), more than the rest of a claim on the client."""
    columns = zip(*map(_claim_values, reqs), strict=True) if reqs else [()] * len(_CLAIM_FIELDS)
    batch = json.dumps(
        dict(zip(_CLAIM_FIELDS, map(list, columns), strict=True)), separators=(",", ":")
    )
    return {"channel": channel, "later": later, "batch": batch}


def claim_one_params(req: ClaimRequest, channel: str, *, later: bool) -> dict[str, Any]:
    """The ``claim_one`` statement's parameters: :func:`claim_params` of ``[req]``, each array's
    one value as it is. With ``later``, the claim keeps no notice (``later`` NULL): the backend
    sends a winner's own (:func:`claim_notice`) after the answer."""
    params: dict[str, Any] = {"channel": channel, "later": None if later else False}
    params.update(zip(_CLAIM_FIELDS, _claim_values(req), strict=True))
    return params


def claim_notice(row: dict[str, Any], channel: str) -> dict[str, Any]:
    """``notify_claim``'s parameters: the claim notice of the won claim answered by ``row``
    (a ``claim_one`` row), as the claim function writes it."""
    notice = ClaimNotice(row["job"], row["slot_key"], row["instance"], row["lease_expires_at"])
    return {"channel": channel, "payload": encode_notice(notice)}


def won_any(found: Sequence[dict[str, Any]]) -> bool:
    """Whether the ``claim`` rows won a slot (and so kept a claim notice to send)."""
    return any(row["verdict"] == "won" for row in found)


def without_repeats(
    reqs: list[tuple[int, ClaimRequest]],
) -> list[list[tuple[int, ClaimRequest]]]:
    """Split a batch, in order, into chunks that never name one (job, slot_key) twice: the
    ``claim`` statement decides a chunk at once, so a second request must see the first."""
    chunks: list[list[tuple[int, ClaimRequest]]] = [[]]
    seen: set[tuple[str, str]] = set()
    for item in reqs:
        _, req = item
        key = (req.job, req.slot_key)
        if key in seen:
            chunks.append([])
            seen = set()
        seen.add(key)
        chunks[-1].append(item)
    return [c for c in chunks if c]


def ticket_params(ticket: Ticket) -> dict[str, Any]:
    """What ``renew``, ``release`` and ``finish`` know the attempt by."""
    return {
        "job": ticket.job,
        "slot_key": ticket.slot_key,
        "attempt": ticket.attempt,
        "token": ticket.token,
        "fence": ticket.fence,
    }


def finish_params(item: FinishRequest, keep: int, channel: str, *, later: bool) -> dict[str, Any]:
    """The ``finish`` statement's parameters: the result and its retry, how to prune (``keep``
    slots), and whether its notification is kept for ``send_notices`` (``later``) or sent at
    commit."""
    ticket, status, error, retry = item
    return {
        **ticket_params(ticket),
        **retry_params(retry),
        "status": str(RunStatus(status)),
        "error": error,
        "ttl_ms": prune_ttl(ticket.history_ttl_ms),
        "keep": keep,
        "batch": PRUNE_BATCH,
        "channel": channel,
        "later": later,
    }


def retry_params(retry: RunRequest | None) -> dict[str, Any]:
    """The ``finish`` statement's ``retry_*`` parameters: the retry's fields (all None: no
    retry)."""
    values = dict.fromkeys(_RETRY_FIELDS) if retry is None else retry.to_dict()
    return {_RETRY_PARAMS[name]: value for name, value in values.items()}


def takeover_params(req: TakeoverRequest, channel: str) -> dict[str, Any]:
    """The parameters of ``peek_takeover`` and ``take_over``."""
    return {
        "job": req.job,
        "slot_key": req.slot_key,
        "run_id": req.run_id,
        "token": req.token,
        "instance": req.instance,
        "lease_ms": req.lease_ms,
        "max_attempts": req.max_attempts,
        "channel": channel,
    }


# -- answers --------------------------------------------------------------------------------


def _run_row(values: dict[str, Any]) -> RunRow | None:
    if values.get("job") is None:
        return None
    return RunRow(**{name: values[name] for name in _RUN_COLUMNS})


def runs(rows: Sequence[dict[str, Any]]) -> list[Run]:
    """The runs of ``history``'s rows."""
    return [r.to_run() for r in map(_run_row, rows) if r is not None]


def slot_records(rows: Sequence[dict[str, Any]]) -> SlotRecords:
    """The answer of ``slot_records``: its runs, and the job's earliest slot or start (the same
    on every row; one row without a run when the slot has no records)."""
    oldest = rows[0]["oldest"] if rows else None
    return SlotRecords(runs(rows), None if oldest is None else int(oldest))


def claim_outcome(req: ClaimRequest, row: dict[str, Any]) -> ClaimOutcome:
    """The answer to ``req`` from its row of the ``claim`` statement."""
    now = int(row["now"])
    verdict = row["verdict"]
    if verdict == "pruned":
        return pruned_outcome(req, now)
    stored = _run_row(row)
    if stored is None:
        # Only if the job lock was bypassed; the transaction is rolled back, the core retries.
        raise BackendUnavailable(f"claim of {req.job} {req.slot_key} raced; retry it")
    return answer_existing(stored, req, now)


def peeked_takeover(req: TakeoverRequest, row: dict[str, Any]) -> TakeoverOutcome | None:
    """Answer a takeover from ``peek_takeover``'s unlocked read (see the lease rules'
    ``peek_takeover``), or None when the lease expired or was released and the locked
    ``take_over`` statement must decide."""
    return peek_answer(_run_row(row), req, int(row["now"]))


def takeover_outcome(req: TakeoverRequest, row: dict[str, Any]) -> TakeoverOutcome:
    """The answer to ``req`` from the ``take_over`` statement's row (the lease rules'
    ``takeover_answer``)."""
    exhausted = row["verdict"] == "exhausted"
    return takeover_answer(req, _run_row(row), int(row["now"]), exhausted=exhausted)


def renewed(ticket: Ticket, row: dict[str, Any]) -> Ticket | LeaseLost:
    """The answer to renewing ``ticket`` from the ``renew`` statement's row."""
    now, expires, attempt = row["now"], row["lease_expires_at"], row["attempt"]
    status, released, ours = row["status"], row["released"], row["ours"]
    if expires is not None:
        return ticket.renewed(int(expires), int(now))
    if ours and status == RunStatus.RUNNING and released:
        return handed_over(ticket)
    return lease_lost(ticket, attempt, status)


def released_or_lost(ticket: Ticket, row: dict[str, Any]) -> LeaseLost | None:
    """None if the ``release`` statement released ``ticket``'s attempt, else the error."""
    return None if row["done"] else lease_lost(ticket, row["attempt"], row["status"])


def finished(
    ticket: Ticket, status: str, error: str | None, rows: Sequence[dict[str, Any]]
) -> Run | LeaseLost:
    """The answer to a result for ``ticket`` from the ``finish`` statement's rows."""
    row = rows[0] if rows else None
    stored = _run_row(row) if row is not None else None
    if stored is not None and row is not None and row["outcome"] == "finished":
        return stored.to_run()
    if already_recorded(stored, ticket, str(RunStatus(status)), error):
        assert stored is not None
        return stored.to_run()  # a retry whose first answer was lost
    return lease_lost(ticket, stored.attempt if stored else None, stored.status if stored else None)
