"""How much each measurement does: the full run (``make bench``) and ``--quick`` for development."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["FULL", "QUICK", "Settings"]


@dataclass(frozen=True)
class Settings:
    """Sizes and durations of one run."""

    name: str
    # 1. floor and fire lag
    floor_ops: int
    """Sequential round trips of the primitive (and of a one-request claim) per backend."""
    fire_window_s: int
    """Seconds of slots counted; every backend fires once per ``FIRE_CYCLE_S``."""
    fire_min_slots: int
    """Slots wanted per backend; jobs due at each instant = this / firings in the window."""
    # 2. burst
    burst_jobs: int
    burst_lead_s: float
    """How far ahead the burst's slot is set: three instances must register and start first."""
    # 3. claim rate (alternated rounds: bench/ladder.py)
    rate_rounds: int
    """Alternated rounds of every step (each step's figure: over all of them)."""
    # 4. idle cost
    idle_jobs: int
    idle_seconds: float
    # 5. failover
    failover_tries: int
    kill_lease_ms: int
    handover_lease_ms: int
    handover_grace_ms: int
    # 6. peers
    peers_jobs: int
    peers_period_s: int
    peers_window_s: int
    # 7. dashboard
    dashboard_jobs: int
    dashboard_runs: int
    """Runs of the per-minute job whose timeline is drawn."""
    dashboard_repeat: int
    """Calls per page after the first."""
    # history at size
    history_sizes: tuple[int, ...] = (10_000, 100_000, 1_000_000)
    """Runs of one job at which its reads are timed (SQLite, PostgreSQL)."""
    history_samples: int = 200
    """Calls of each read per size."""
    history_prune_cycles: int = 100
    """Claims and finishes of the per-second job while its history is pruned."""
    # curves
    curve_idle_jobs: tuple[int, ...] = (1_000, 10_000, 100_000)
    """Registered jobs of the idle-cost curve."""
    curve_burst_jobs: tuple[int, ...] = (1_000, 10_000, 50_000)
    """Slots due at once of the burst-time curve."""
    curve_instances: tuple[int, ...] = (3, 10, 30)
    """Contending processes of the claim-latency curve."""
    curve_rate_rounds: int = 6
    """Alternated rounds of the claim-latency curve's sizes (no record steps)."""
    rate_step_s: float = 0.5
    """Length of one step of one round of the claim rate (and of the claim curve)."""


FULL = Settings(
    name="full",
    floor_ops=500,
    fire_window_s=60,
    fire_min_slots=200,
    burst_jobs=10_000,
    burst_lead_s=7.0,
    rate_rounds=14,
    idle_jobs=10_000,
    idle_seconds=60.0,
    failover_tries=5,
    kill_lease_ms=2_000,
    handover_lease_ms=20_000,
    handover_grace_ms=300,
    peers_jobs=30,
    peers_period_s=10,
    peers_window_s=70,
    dashboard_jobs=10_000,
    dashboard_runs=12_000,
    dashboard_repeat=7,
)

QUICK = Settings(
    name="quick",
    floor_ops=100,
    fire_window_s=12,
    fire_min_slots=30,
    burst_jobs=1_000,
    burst_lead_s=6.0,
    rate_rounds=4,
    idle_jobs=2_000,
    idle_seconds=10.0,
    failover_tries=2,
    kill_lease_ms=2_000,
    handover_lease_ms=20_000,
    handover_grace_ms=300,
    peers_jobs=5,
    peers_period_s=10,
    peers_window_s=30,
    dashboard_jobs=2_000,
    dashboard_runs=3_000,
    dashboard_repeat=3,
    history_sizes=(10_000, 100_000),
    history_samples=100,
    history_prune_cycles=30,
    curve_idle_jobs=(500, 2_000, 5_000),
    curve_burst_jobs=(500, 2_000, 5_000),
    curve_instances=(3, 10, 30),
    curve_rate_rounds=2,
)
