# ruff: noqa: RUF001 - the tables use typographic dashes and signs
"""The fire lag section of the bench report: the ``jitter_ms=0`` table and the defaults table."""

from __future__ import annotations

from typing import Any

from bench import report


def _lags(p99: float, *, missed: int = 0, per_slot: float | None = None) -> dict[str, Any]:
    row: dict[str, Any] = {
        "expected": 204,
        "ran": 204 - missed,
        "missed": missed,
        "duplicates": 0,
        "p50": p99 / 2,
        "p99": p99,
        "max": p99 + 1,
        "lags": [p99],
    }
    if per_slot is not None:
        row["claims_per_slot"] = per_slot
    return row


def _results(
    defaults: dict[str, Any] | None, distinct: dict[str, dict[str, float]] | None = None
) -> dict[str, Any]:
    fire: dict[str, Any] = {"jobs_per_instant": 17, "window_s": 60, "problems": []}
    fire.update(redis=_lags(9.0), sqlite=_lags(4.0))
    if defaults is not None:
        fire["defaults"] = {"jobs_per_instant": 17, "window_s": 60, "problems": [], **defaults}
    floor = {
        name: {"floor_p50": 0.2, "floor_p99": 1.0, "claim_p50": 0.3, "claim_p99": 1.5}
        for name in ("redis", "sqlite")
    }
    for name, figures in (distinct or {}).items():
        floor[name].update(figures)
    targets = {
        "redis": {"available": True, "lease": True},
        "sqlite": {"available": True, "lease": True},
        "nats": {"available": False, "lease": False, "reason": "no server"},
    }
    return {"targets": targets, "fire": fire, "floor": floor}


def test_the_defaults_table_reads_each_backend_against_the_same_target() -> None:
    text = "\n".join(
        report.fire_section(
            _results({"redis": _lags(5.5, per_slot=1.02), "sqlite": _lags(7.0, missed=1)})
        )
    )
    first, defaults = text.split("### With every option at its default")
    # jitter_ms=0: redis 9.0 - 1.0 = 8.0 ms over the floor, sqlite 3.0.
    assert "| redis | 204/204 | 0 / 0 | 0.20 ms / 1.00 ms |" in first
    assert "| 8.00 ms | 9.00× |" in first and first.count("**met**") == 1
    # Defaults: redis 4.5 ms over the floor with 1.02 claims a slot is met; sqlite missed a slot.
    redis = "| redis | 204/204 | 0 / 0 | 2.75 ms | 5.50 ms | 6.50 ms | 4.50 ms | – / – | – | 1.02 |"
    sqlite = "| sqlite | 203/204 | 1 / 0 | 3.50 ms | 7.00 ms | 8.00 ms | 6.00 ms | – / – | – | – |"
    assert redis + " **met** |" in defaults and sqlite + " **not met** |" in defaults
    assert "| nats | not available: no server |" + " – |" * 9 in defaults


def test_the_defaults_table_shows_the_distinct_key_floor_beside_the_target() -> None:
    distinct = {
        "redis": {"distinct_p50": 1.5, "distinct_p99": 2.25},
        "sqlite": {"distinct_p50": 4.0, "distinct_p99": 9.5},
    }
    results = _results({"redis": _lags(5.5), "sqlite": _lags(7.0)}, distinct)
    results["floor"]["sqlite"].update(instant_p50=0.5, instant_p99=3.0)
    first, defaults = "\n".join(report.fire_section(results)).split("### With every option")
    # Redis: 5.5 - 2.25 = 3.25 ms over the distinct-key floor; sqlite 7.0 - 9.5 = -2.5 ms. The
    # target stays read against the one-client floor (sqlite 6.0 ms over it: not met).
    assert "| 4.50 ms | 1.50 ms / 2.25 ms | 3.25 ms | – | **met** |" in defaults
    assert "| 6.00 ms | 4.00 ms / 9.50 ms | -2.50 ms | – | **not met** |" in defaults
    assert "distinct-key floor p50 / p99 | p99 − distinct-key floor p99 |" in defaults
    # The jitter_ms=0 table keeps the same-key floor (sqlite: 4.0 - 3.0 ms) and no distinct one.
    assert "| 0.50 ms / 3.00 ms | 1.00 ms |" in first and "distinct" not in first


def test_results_from_before_the_defaults_run_make_one_table() -> None:
    text = "\n".join(report.fire_section(_results(None)))
    assert "### With every option at its default" not in text
    assert "| sqlite | 204/204 | 0 / 0 |" in text
