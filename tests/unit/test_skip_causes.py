"""Skip causes (``Run.skip_cause``): the core classifies skips and refusals by the typed cause,
never by the words of a reason; records stored without a cause are read by their old words in
one place (``anarchon.backend.legacy_skip_cause``), the compatibility path."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from anarchon import Run, RunStatus, SkipCause, Trigger
from anarchon._metrics import SLOT_OUTCOMES, Counters, Metrics, refused, unrecorded
from anarchon.backend import (
    BEHIND,
    OVERLAP,
    PRUNED_REASON,
    TOO_LATE,
    ClaimOutcome,
    ClaimStatus,
    legacy_skip_cause,
)
from anarchon.backends.nats import _records as nats_records
from anarchon.control import PAUSED
from anarchon.kit.lease import RunRow, skip_cause_of, stored_run
from anarchon.testing._requests import request
from anarchon.web._data import fate_of

SLOT = 1_800_000_000_000
AT = datetime.fromtimestamp(SLOT / 1000, UTC)


def _run(reason: str | None, cause: SkipCause | None, **kw: Any) -> Run:
    return Run(
        job="a",
        slot=AT,
        run_id="r",
        instance=str(kw.pop("instance", "i1")),
        trigger=Trigger.SCHEDULE,
        attempt=1,
        status=kw.pop("status", RunStatus.SKIPPED),
        started_at=AT,
        reason=reason,
        skip_cause=cause,
    )


def _answer(status: ClaimStatus, reason: str | None, cause: SkipCause | None) -> ClaimOutcome:
    return ClaimOutcome(status=status, run=_run(reason, cause))


def _slots(outcome: ClaimOutcome) -> dict[str, int]:
    counters = Counters()
    counters.claim_answered(outcome, "i1")
    job = Metrics.of(counters).by_job.get("a")
    return {} if job is None else {k: v for k, v in job.slots.items() if v}


@pytest.mark.parametrize(
    ("cause", "key"),
    [
        (SkipCause.OVERLAP, "skipped_overlap"),
        (SkipCause.TOO_LATE, "skipped_too_late"),
        (SkipCause.BEHIND, "skipped_behind"),
        (SkipCause.PAUSED, "skipped_paused"),
        (None, "skipped_other"),
    ],
)
def test_a_skip_is_counted_by_its_cause_whatever_its_words(
    cause: SkipCause | None, key: str
) -> None:
    assert key in SLOT_OUTCOMES
    # Worded by a backend that knows nothing of anarchon's words: the cause decides.
    assert _slots(_answer(ClaimStatus.SKIPPED, "came in after its time", cause)) == {key: 1}
    # A reason in another kind's words does not move it either.
    assert _slots(_answer(ClaimStatus.SKIPPED, f"{PAUSED}ops", cause)) == {key: 1}


def test_refusals_and_unrecorded_skips_are_told_by_their_cause_not_their_words() -> None:
    for cause in (SkipCause.PRUNED, SkipCause.UNKNOWN):
        assert refused(_answer(ClaimStatus.LOST, "history trimmed here", cause))
    # A real loss worded like a refusal is a loss.
    assert not refused(_answer(ClaimStatus.LOST, PRUNED_REASON, None))
    assert not refused(_answer(ClaimStatus.LOST, "unknown: winner", None))
    assert unrecorded(_answer(ClaimStatus.SKIPPED, "nothing kept", SkipCause.NOT_RECORDED))
    not_marked = _answer(ClaimStatus.SKIPPED, "too late: x; not recorded", SkipCause.TOO_LATE)
    assert not unrecorded(not_marked)
    assert _slots(not_marked) == {"skipped_too_late": 1}
    assert _slots(_answer(ClaimStatus.SKIPPED, "nothing kept", SkipCause.NOT_RECORDED)) == {}


def test_the_dashboard_fate_of_a_skip_is_its_cause() -> None:
    assert fate_of(_run("came in late", SkipCause.TOO_LATE)) == "late"
    assert fate_of(_run("fell behind", SkipCause.BEHIND)) == "late"
    assert fate_of(_run("on hold", SkipCause.PAUSED)) == "paused"
    assert fate_of(_run(f"{TOO_LATE}x", SkipCause.OVERLAP)) == "skipped"
    assert fate_of(_run(f"{PAUSED}ops", None)) == "skipped"


@pytest.mark.parametrize(
    ("reason", "cause"),
    [
        (PRUNED_REASON, SkipCause.PRUNED),
        ("unknown: Redis holds no record of this job before 2026-12-01", SkipCause.UNKNOWN),
        (f"{OVERLAP}run r1 (slot 2026-12-01T00:00:00+00:00) still holds", SkipCause.OVERLAP),
        (f"{TOO_LATE}i1 reached the slot 70000 ms after it", SkipCause.TOO_LATE),
        (f"{BEHIND}i1 reached the slot 5000 ms after it, with 3 slots", SkipCause.BEHIND),
        (f"{PAUSED}alice@web-1 (all jobs)", SkipCause.PAUSED),
        ("too late: i1 could send its claim only late; not recorded", SkipCause.NOT_RECORDED),
        ("missed: x; not recorded: the slot is too close to the end", SkipCause.NOT_RECORDED),
        ("lost: the winning claim (seq 4) was already trimmed", None),
        ("missed: no instance carried the job from a to b", None),
        ("lease lost", None),
        ("handed over", None),
        ("", None),
        (None, None),
    ],
)
def test_old_words_read_as_their_cause(reason: str | None, cause: SkipCause | None) -> None:
    """The compatibility path: what the words of a record stored without a cause meant."""
    assert legacy_skip_cause(reason) is cause
    assert skip_cause_of(None, reason) is cause


def test_a_stored_cause_wins_over_words_and_an_unknown_one_falls_back_to_them() -> None:
    assert skip_cause_of("too_late", "anything at all") is SkipCause.TOO_LATE
    assert skip_cause_of(SkipCause.PAUSED, f"{TOO_LATE}x") is SkipCause.PAUSED
    # Written by a newer anarchon with a cause this one does not know: its words say.
    assert skip_cause_of("frozen", f"{BEHIND}x") is SkipCause.BEHIND
    assert skip_cause_of("frozen", "anything") is None


def _stored(**extra: Any) -> dict[str, Any]:
    return {
        "job": "a",
        "slot_key": str(SLOT),
        "slot": SLOT,
        "attempt": 1,
        "run_id": "r",
        "token": "t",
        "instance": "i1",
        "trigger": "schedule",
        "status": "skipped",
        "fence": 0,
        "started_at": SLOT,
        "finished_at": SLOT,
        **extra,
    }


def test_a_lease_record_stored_without_a_cause_reads_its_old_words() -> None:
    """Redis's JSON records and the rows of SQLite and PostgreSQL before skip causes."""
    old = _stored(reason=f"{PAUSED}ops")
    assert stored_run(old).skip_cause is SkipCause.PAUSED
    assert RunRow(**old).to_run().skip_cause is SkipCause.PAUSED
    new = _stored(reason="on hold by ops", skip_cause="paused")
    assert stored_run(new).skip_cause is SkipCause.PAUSED
    assert RunRow(**new).to_run().skip_cause is SkipCause.PAUSED
    ran = _stored(status="succeeded", reason=None)
    assert stored_run(ran).skip_cause is None and RunRow(**ran).to_run().skip_cause is None


def _nats_claim(payload: bytes) -> nats_records.Claim:
    stored = nats_records.Stored(seq=3, subject="anarchon.a.claims", time_ms=SLOT, data=payload)
    claim = nats_records.decode_claim(stored)
    assert claim is not None
    return claim


def test_a_nats_skip_record_keeps_its_cause_and_an_old_one_reads_its_words() -> None:
    new = nats_records.encode_claim(
        request("a", SLOT, skip_reason="came in late", skip_cause=SkipCause.TOO_LATE)
    )
    assert b'"skip_cause":"too_late"' in new
    assert _nats_claim(new).run().skip_cause is SkipCause.TOO_LATE
    # A skip record published before skip causes: no "skip_cause" in its payload.
    old = nats_records.encode_claim(request("a", SLOT, skip_reason=f"{TOO_LATE}i1 reached"))
    assert b"skip_cause" not in old
    assert _nats_claim(old).run().skip_cause is SkipCause.TOO_LATE
    run_claim = nats_records.encode_claim(request("a", SLOT))
    assert _nats_claim(run_claim).run().skip_cause is None
