# ruff: noqa: RUF001 - the tables use typographic dashes and multiplication signs
"""Curves, not points: how cost grows with the number of jobs and instances.

Three measurements of the bench, each repeated at several sizes (``Settings.curve_*``), per
backend, reusing the bench's own modules rather than copies of them:

* **idle** (:mod:`bench.idle`): one instance with N registered jobs (nothing due), CPU and RSS
  over ``idle_seconds``; the first size also starts the 0-job reference;
* **burst** (:mod:`bench.burst`): N slots due in the same second, three instances; the time
  until the last handler started; the lead before the slot grows with N (registering and
  starting 50 000 jobs takes longer than 10 000);
* **claim** (:mod:`bench.claim_rate`): N processes contending for the same keys, one-request
  ``Backend.claim`` round trips (p50, p99) beside the same-work floor's (:mod:`bench.same_work`)
  and the raw primitive's under the same contention, in alternated rounds as section 3 takes
  them (``curve_rate_rounds`` of them, no record steps).

A size that fails (raises, times out, does not start) is a row saying so; the other sizes
and measurements still run. Plots: ``curves-idle.png``, ``curves-burst.png``,
``curves-claim.png`` beside the bench's other outputs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import traceback
from pathlib import Path
from typing import Any

from . import burst, claim_rate, idle
from .context import Context
from .fleet import stop

__all__ = ["markdown", "measure", "plots"]

BURST_LEAD_PER_10K_S = 1.0
"""The burst's lead is scaled by ``max(1, N / 10 000)`` from the settings' lead."""
CLAIM_LEAD_PER_INSTANCE_S = 0.4
"""Extra lead per contending process: 30 interpreters must import and connect first."""


def _failure(exc: BaseException) -> dict[str, Any]:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    where = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
    at = f" at {where[0].filename.rsplit('/', 1)[-1]}:{where[0].lineno}" if where else ""
    return {"error": f"{type(exc).__name__}: {text}"[:160] + at}


def _sized(ctx: Context, **changes: Any) -> Context:
    return dataclasses.replace(ctx, settings=dataclasses.replace(ctx.settings, **changes))


async def _idle(ctx: Context) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, jobs in enumerate(ctx.settings.curve_idle_jobs):
        ctx.say(f"curves: idle, {jobs} jobs")
        sub = _sized(ctx, idle_jobs=jobs)
        running: idle.Idle | None = None
        try:
            running = await idle.start(sub, reference=k == 0)
            out[str(jobs)] = await idle.finish(sub, running)
        except Exception as exc:
            out[str(jobs)] = _failure(exc)
            if running is not None:
                with contextlib.suppress(Exception):
                    await stop(list(running.procs.values()), limit_s=30)
    return out


async def _burst(ctx: Context) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for jobs in ctx.settings.curve_burst_jobs:
        ctx.say(f"curves: burst, {jobs} slots")
        lead = ctx.settings.burst_lead_s * max(1.0, jobs / 10_000 * BURST_LEAD_PER_10K_S)
        try:
            out[str(jobs)] = await burst.measure(_sized(ctx, burst_jobs=jobs, burst_lead_s=lead))
        except Exception as exc:
            out[str(jobs)] = _failure(exc)
    return out


async def _claim(ctx: Context) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for instances in ctx.settings.curve_instances:
        row: dict[str, Any] = {}
        for target in ctx.available():
            ctx.say(f"curves: claim, {instances} processes on {target.name}")
            lead = claim_rate.START_LEAD_S + CLAIM_LEAD_PER_INSTANCE_S * instances
            try:
                rounds = ctx.settings.curve_rate_rounds
                row[target.name] = await claim_rate._one(ctx, target.name, instances, lead, rounds)
            except Exception as exc:
                row[target.name] = _failure(exc)
        out[str(instances)] = row
    return out


async def measure(ctx: Context) -> dict[str, Any]:
    """The three curves; each size's result or the reason it has none."""
    results: dict[str, Any] = {}
    for name, step in (("idle", _idle), ("burst", _burst), ("claim", _claim)):
        try:
            results[name] = await step(ctx)
        except Exception as exc:
            results[name] = _failure(exc)
    return results


# -- report ---------------------------------------------------------------------------------


def _names(results: dict[str, Any]) -> list[str]:
    return [n for n, t in results["targets"].items() if t["available"]]


def _ms(value: float | None) -> str:
    if value is None:
        return "–"
    return (
        f"{value:.2f} ms" if value < 10 else f"{value:.1f} ms" if value < 100 else f"{value:.0f} ms"
    )


def _idle_cell(row: Any, name: str, jobs: str) -> str:
    if not isinstance(row, dict):
        return "–"
    if "error" in row:
        return f"failed: {row['error']}"
    r = (row.get(name) or {}).get(jobs)
    if r is None:
        return "–"
    if "cpu_pct" not in r:
        return "failed: " + str(r.get("log", "did not start"))[:80].replace("\n", " ").replace(
            "|", "/"
        )
    settle = r.get("settled_s")
    note = "" if "error" not in r else " (start-up not settled)"
    return (
        f"{r['cpu_pct']:.2f} %, {r['rss_mb']:.0f} MB"
        + (f", settled {settle:.1f} s" if settle is not None else "")
        + note
    )


def _burst_cell(row: Any, name: str) -> str:
    if not isinstance(row, dict):
        return "–"
    if "error" in row:
        return f"failed: {row['error']}"
    r = row.get(name)
    if not isinstance(r, dict):
        return "–"
    if "not_ready" in r:
        return f"not ready in {r.get('lead_s', 0):.0f} s"
    if r.get("all_ms") is None:
        text = f"none of {r.get('jobs', '?')} started"
    else:
        text = f"{r['all_ms'] / 1000:.2f} s"
    if r.get("missed") or r.get("duplicates"):
        text += f" ({r['missed']} missed, {r['duplicates']} dup)"
    if r.get("missed") and r.get("top_warning"):
        message = str(r["top_warning"][0]).replace("|", "/")
        text += f"; logged: {message[:110]}"
    return text


def _claim_cell(row: Any, name: str) -> str:
    if not isinstance(row, dict):
        return "–"
    r = row.get(name)
    if not isinstance(r, dict):
        return "–"
    if "error" in r:
        return f"failed: {r['error'][:80]}"
    c, p = r.get("claim_lat") or {}, r.get("primitive_lat") or {}
    w = r.get("same_work_lat")
    steps = r["steps"]
    dup = steps["claim"]["duplicates"] + steps["same_work"]["duplicates"]
    same = f"same work {_ms(w.get('p50'))} / {_ms(w.get('p99'))}, " if w else ""
    return (
        f"{_ms(c.get('p50'))} / {_ms(c.get('p99'))} ({same}primitive {_ms(p.get('p50'))} / "
        f"{_ms(p.get('p99'))})" + (f", **{dup} won twice**" if dup else "")
    )


def _style(name: str) -> str:
    """A curve's line: dashed for the raw primitive, dotted for the same-work floor."""
    if name.endswith(" primitive"):
        return "--"
    return ":" if name.endswith(" same work") else "-"


def _claim_pick(q: str) -> Any:
    """The claim curve's value ``q`` (p50, p99) of a line: ``<backend>`` (the claim),
    ``<backend> same work`` or ``<backend> primitive``."""

    def pick(row: Any, name: str) -> Any:
        if name.endswith(" primitive"):
            return row[name.split()[0]]["primitive_lat"][q]
        if name.endswith(" same work"):
            return row[name.split()[0]]["same_work_lat"][q]
        return row[name]["claim_lat"][q]

    return pick


def markdown(results: dict[str, Any]) -> list[str]:
    """The curves' section of bench/results.md (empty when not measured)."""
    curves = results.get("curves")
    if curves is None:
        return []
    names = _names(results)
    out = [
        "## Curves: how cost grows",
        "",
        "The idle, burst and claim measurements repeated at several sizes, per backend "
        "(plots: curves-idle.png, curves-burst.png, curves-claim.png). A size that failed says "
        "why.",
        "",
    ]
    for title, key in (
        ("Idle: CPU (% of a core) and RSS of one instance, by registered jobs", "idle"),
        ("Burst: slot → last of N handlers started, three instances, by slots due", "burst"),
        (
            "Claim round trip p50 / p99 by contending processes (one-request `claim`; in "
            "brackets the same-work floor, the backend's claim storage work by a bare client, "
            "and the raw primitive, under the same contention)",
            "claim",
        ),
    ):
        part = curves.get(key)
        out += [f"**{title}**", ""]
        if not isinstance(part, dict) or "error" in part:
            why = part.get("error") if isinstance(part, dict) else "not measured"
            out += [f"Not measured: {why}", ""]
            continue
        sizes = list(part)
        rows = []
        for name in [*names, "memory"] if key == "burst" else names:
            if key == "idle":
                cells = [_idle_cell(part[s], name, s) for s in sizes]
                ref = (part.get(sizes[0]) or {}).get(name, {}).get("0") if sizes else None
                if isinstance(ref, dict) and "cpu_pct" in ref:
                    cells.insert(0, f"{ref['cpu_pct']:.2f} %, {ref['rss_mb']:.0f} MB")
                else:
                    cells.insert(0, "–")
            elif key == "burst":
                cells = [_burst_cell(part[s], name) for s in sizes]
            else:
                cells = [_claim_cell(part[s], name) for s in sizes]
            rows.append([name, *cells])
        header = ["backend", *(["0 jobs"] if key == "idle" else [])]
        unit = {"idle": "jobs", "burst": "slots", "claim": "processes"}[key]
        header += [f"{int(s):,} {unit}" for s in sizes]
        out += _table(header, rows)
        out.append("")
    return out


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


# -- plots ----------------------------------------------------------------------------------


def _points(part: dict[str, Any], pick: Any) -> list[tuple[int, float]]:
    points = []
    for size, row in part.items():
        with contextlib.suppress(KeyError, TypeError, ValueError):
            value = pick(row)
            if value is not None:
                points.append((int(size), float(value)))
    return sorted(points)


def plots(results: dict[str, Any], folder: Path) -> list[Path]:
    """curves-idle.png, curves-burst.png, curves-claim.png in ``folder``; the ones written."""
    curves = results.get("curves")
    if not isinstance(curves, dict):
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    colors = dict(zip(["sqlite", "redis", "postgres", "nats", "memory"], palette, strict=False))
    names = _names(results)
    written = []

    def draw(key: str, panels: list[tuple[str, Any, str]], xlabel: str, extra: list[str]) -> None:
        part = curves.get(key)
        if not isinstance(part, dict) or "error" in part:
            return
        fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.5), squeeze=False)
        drawn = False
        for ax, (title, pick, ylabel) in zip(axes[0], panels, strict=True):
            lines = False
            for name in [*names, *extra]:
                points = _points(part, lambda row, name=name, pick=pick: pick(row, name))
                if points:
                    drawn = lines = True
                    ax.plot(
                        [p[0] for p in points],
                        [p[1] for p in points],
                        marker="o",
                        label=name,
                        color=colors.get(name.split()[0], "black"),
                        linestyle=_style(name),
                    )
            ax.set_xscale("log")
            sizes = sorted(int(k) for k in part)
            ax.set_xticks(sizes, [f"{x:,}" for x in sizes])
            ax.xaxis.set_minor_formatter(NullFormatter())
            ax.set_xlabel(xlabel)
            ax.set_ylabel(ylabel)
            ax.set_title(title, fontsize=10)
            ax.grid(True, which="both", alpha=0.3)
            if lines:
                ax.legend(fontsize=8)
        if drawn:
            fig.tight_layout()
            path = folder / f"curves-{key}.png"
            fig.savefig(path, dpi=100)
            written.append(path)
        plt.close(fig)

    def idle_value(field: str) -> Any:
        return lambda row, name: row[name][next(k for k in row[name] if k != "0")][field]

    draw(
        "idle",
        [
            ("Idle CPU of one instance", idle_value("cpu_pct"), "% of a core"),
            ("RSS of one instance", idle_value("rss_mb"), "MB"),
        ],
        "registered jobs (log)",
        [],
    )
    draw(
        "burst",
        [
            (
                "Slot → last handler started (3 instances)",
                lambda row, name: row[name]["all_ms"] / 1000,
                "seconds",
            )
        ],
        "slots due in the same second (log)",
        ["memory"],
    )

    claim = _claim_pick
    floors = [f"{n} {kind}" for n in names for kind in ("same work", "primitive")]
    draw(
        "claim",
        [
            ("Claim round trip p50 (dotted: same work; dashed: primitive)", claim("p50"), "ms"),
            ("Claim round trip p99 (dotted: same work; dashed: primitive)", claim("p99"), "ms"),
        ],
        "contending processes (log)",
        floors,
    )
    return written
