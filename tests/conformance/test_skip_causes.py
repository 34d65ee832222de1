"""Every backend answers a slot it cannot run, or cannot record, with its typed skip cause
(``Run.skip_cause``): here a slot the store cannot vouch for and a skip a broker cannot
record, each backend as it answers them; in the shipped contract suite (``test_contract.py``),
a skip worded any way and a pruned slot. The metrics and the dashboard read the cause alone."""

from __future__ import annotations

from anarchon import Backend, RunStatus, SkipCause
from anarchon.backend import TOO_LATE, ClaimStatus
from anarchon.testing._requests import lease, request
from tests.harness import Harness

OLD_SLOT = 1_000_000_000_000
"""2001-09-09: before any server here started, and long out of any de-duplication window."""


async def test_a_slot_of_2001_answers_the_cause_each_backend_gives_it(
    harness: Harness, backend: Backend
) -> None:
    """A new job's slot from 2001: Redis cannot vouch for it (it may have run before the server
    started: UNKNOWN, refused); NATS could no longer tell a record of it from its claim (too
    late, NOT_RECORDED); the other backends, which keep every slot they ever recorded, run it."""
    [run] = await backend.claim([request(job="ran", slot=OLD_SLOT, **lease(backend))])
    words = f"{TOO_LATE}test"
    [skip] = await backend.claim(
        [
            request(
                job="skip",
                slot=OLD_SLOT,
                skip_reason=words,
                skip_cause=SkipCause.TOO_LATE,
                **lease(backend),
            )
        ]
    )
    answers = [(a.status, a.run.status, a.run.skip_cause) for a in (run, skip)]
    if harness.name == "redis":
        refused = (ClaimStatus.LOST, RunStatus.SKIPPED, SkipCause.UNKNOWN)
        assert answers == [refused, refused]
        assert run.run.reason is not None and run.error is None
    elif not harness.lease:
        unrecorded = (ClaimStatus.SKIPPED, RunStatus.SKIPPED, SkipCause.NOT_RECORDED)
        assert answers == [unrecorded, unrecorded]
        assert await backend.history("ran") == await backend.history("skip") == []
    else:
        assert answers == [
            (ClaimStatus.WON, RunStatus.RUNNING, None),
            (ClaimStatus.SKIPPED, RunStatus.SKIPPED, SkipCause.TOO_LATE),
        ]
