"""The distinct-key floor's split: each probe claims the jobs the scheduler would prefer it for."""

from __future__ import annotations

from bench.fire_lag import INSTANCE_IDS, JOB_PREFIX
from bench.probe import preferred

from anarchon._rendezvous import rank


def test_the_carriers_share_every_job_once_as_the_ranking_does() -> None:
    for slot in (1_700_000_000_000, 1_700_000_001_000, 1_700_000_002_000):
        shares = [preferred(INSTANCE_IDS, n, JOB_PREFIX, 17, slot) for n in range(3)]
        assert sorted(k for share in shares for k in share) == list(range(17))
        for n, share in enumerate(shares):
            for k in range(17):
                first = rank(INSTANCE_IDS[n], INSTANCE_IDS, f"{JOB_PREFIX}{k}:{slot}") == 0
                assert (k in share) is first
