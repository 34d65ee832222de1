"""The bench's curves section: a size that fails is a row saying so, not a crash."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from bench import burst, claim_rate, curves, idle
from bench.context import Context
from bench.services import Services, Target
from bench.settings import QUICK


def _ctx(tmp_path: Path) -> Context:
    targets = {"sqlite": Target("sqlite", True, available=True)}
    return Context(QUICK, Services(tmp_path), targets, tmp_path, None)


async def test_a_failing_size_is_a_row_and_the_rest_still_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def idle_start(ctx: Context, reference: bool = True) -> idle.Idle:
        if ctx.settings.idle_jobs == QUICK.curve_idle_jobs[1]:
            raise TimeoutError("instances did not start")
        return idle.Idle()

    async def idle_finish(ctx: Context, running: idle.Idle) -> dict[str, Any]:
        return {"sqlite": {str(ctx.settings.idle_jobs): {"cpu_pct": 0.5, "rss_mb": 40.0}}}

    async def burst_measure(ctx: Context) -> dict[str, Any]:
        raise RuntimeError("boom")

    async def claim_one(
        ctx: Context, name: str, instances: int, lead: float, rounds: int
    ) -> dict[str, Any]:
        # The curve's sizes: fewer alternated rounds than section 3's, no record steps.
        assert rounds == ctx.settings.curve_rate_rounds < ctx.settings.rate_rounds
        return {
            "steps": {"claim": {"duplicates": 0}, "same_work": {"duplicates": 0}},
            "claim_lat": {"p50": 1.0, "p99": 2.0},
            "same_work_lat": {"p50": 0.8, "p99": 1.5},
            "primitive_lat": {"p50": 0.5, "p99": 1.0},
        }

    monkeypatch.setattr(idle, "start", idle_start)
    monkeypatch.setattr(idle, "finish", idle_finish)
    monkeypatch.setattr(burst, "measure", burst_measure)
    monkeypatch.setattr(claim_rate, "_one", claim_one)
    ctx = _ctx(tmp_path)
    ctx.say = lambda message: None  # type: ignore[method-assign]
    measured = await curves.measure(ctx)

    small, failed, large = (str(n) for n in QUICK.curve_idle_jobs)
    assert measured["idle"][failed]["error"].startswith(
        "TimeoutError: instances did not start at test_bench_curves.py:"
    )
    assert measured["idle"][large]["sqlite"][large]["cpu_pct"] == 0.5
    assert all("RuntimeError: boom" in r["error"] for r in measured["burst"].values())
    assert set(measured["claim"]) == {str(n) for n in QUICK.curve_instances}

    results = {"curves": measured, "targets": {"sqlite": {"available": True}}}
    text = "\n".join(curves.markdown(results))
    assert "failed: TimeoutError: instances did not start" in text
    assert "failed: RuntimeError: boom" in text
    assert "1.00 ms / 2.00 ms (same work 0.80 ms / 1.50 ms, primitive 0.50 ms / 1.00 ms)" in text
    written = curves.plots(results, tmp_path)
    assert [p.name for p in written] == ["curves-idle.png", "curves-claim.png"]
    assert small in measured["idle"]


def test_nothing_measured_gives_no_section() -> None:
    assert curves.markdown({"targets": {}}) == []
