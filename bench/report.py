# ruff: noqa: RUF001 - the tables use typographic dashes, minus and multiplication signs
"""Turn one run's results into bench/results.md (tables, each figure beside its reference) and
the lag plot (matplotlib, Agg)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import curves

__all__ = ["markdown", "plot", "plot_history"]

FIRE_TARGET_MS = 5.0
BURST_TARGET_S = 1.0
CORE_BURST_TARGET_S = 0.3
RATE_TARGET = 0.7
IDLE_CPU_TARGET = 1.0
IDLE_RSS_TARGET = 100.0
JOBS_PAGE_TARGET_MS = 300.0
TIMELINE_YEAR_TARGET_MS = 500.0
HISTORY_TARGET_MS = 10.0
PRUNE_PAUSE_TARGET_MS = 50.0


def ms(value: float | None, digits: int | None = None) -> str:
    """Milliseconds, with as many decimals as make sense."""
    if value is None:
        return "–"
    if digits is None:
        digits = 2 if abs(value) < 10 else 1 if abs(value) < 100 else 0
    return f"{value:.{digits}f} ms"


def secs(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f} s"


def ratio(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}×"


def pct(value: float | None, digits: int = 0) -> str:
    return "–" if value is None else f"{value * 100:.{digits}f} %"


def verdict(ok: bool | None) -> str:
    return "–" if ok is None else ("**met**" if ok else "**not met**")


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def _unavailable(results: dict[str, Any], name: str) -> str | None:
    target = results["targets"].get(name)
    if target is None:
        return "not selected"
    return None if target["available"] else f"not available: {target['reason']}"


def _names(results: dict[str, Any], lease: bool = False) -> list[str]:
    return [n for n, t in results["targets"].items() if t["lease"] or not lease]


# -- sections -------------------------------------------------------------------------------


def fire_section(results: dict[str, Any]) -> list[str]:
    fire, floor = results.get("fire"), results.get("floor", {})
    if fire is None:
        return []
    out = [
        "## 1. Fire lag (slot → handler start, `jitter_ms=0`)",
        "",
        f"Three instances per backend; {fire['jobs_per_instant']} jobs due at each instant "
        f"(claimed in one batch), one instant every 5 s per backend, backends staggered by 1 s; "
        f"{fire['window_s']} s of slots. Floor: the raw primitive's round trip, one client, "
        "sequential (see `bench/primitives.py`); claim call: one-request `Backend.claim` round "
        "trip, same conditions. Target: lag p99 ≤ floor p99 + 5 ms. Same-instant floor: the "
        "raw primitive under the fire lag's own conditions (three processes wake at the same "
        "instants, each claims the same jobs in one batch; a key's lag is the instant to the "
        "answer of the batch that won it): what a scheduler with no code of its own sees here, "
        "so lag p99 − same-instant floor p99 is what anarchon adds. The target is read against "
        "the one-client floor, as the issue states it.",
        "",
    ]
    rows = _per_backend(results, fire, floor, 13, _fire_row)
    core = fire.get("memory")
    if isinstance(core, dict) and core.get("expected"):
        rows.append(
            [
                "memory: the core alone (1 instance)",
                f"{core['ran']}/{core['expected']}",
                f"{core['missed']} / {core['duplicates']}",
                "–",
                "–",
                ms(core["p50"]),
                ms(core["p99"]),
                ms(core["max"]),
                "–",
                "–",
                "–",
                "–",
                "reference",
            ]
        )
    out += table(
        [
            "backend",
            "slots ran/due",
            "missed / dup",
            "floor p50 / p99",
            "claim call p50 / p99",
            "lag p50",
            "lag p99",
            "lag max",
            "p99 − floor p99",
            "p99 / floor p99",
            "same-instant floor p50 / p99",
            "p99 − same-instant floor p99",
            "target",
        ],
        rows,
    )
    if fire.get("problems"):
        out += ["", "Start-up problems: " + "; ".join(fire["problems"])]
    defaults = fire.get("defaults")
    if isinstance(defaults, dict):
        out += ["", *_fire_defaults(results, defaults, floor)]
    return [*out, ""]


def _per_backend(
    results: dict[str, Any],
    section: dict[str, Any],
    floor: dict[str, Any],
    width: int,
    row: Callable[[dict[str, Any], dict[str, Any]], list[str]],
) -> list[list[str]]:
    """One row per backend: its name, then ``row`` of its figures and its floors, or why there
    are none (``width`` cells in all)."""
    rows = []
    for name in _names(results):
        why = _unavailable(results, name)
        if why or name not in section:
            rows.append([name, why or "failed", *["–"] * (width - 2)])
        else:
            rows.append([name, *row(section[name], floor.get(name, {}))])
    return rows


def _slot_cells(f: dict[str, Any]) -> list[str]:
    """Slots ran of those due; missed and duplicate slots."""
    return [f"{f['ran']}/{f['expected']}", f"{f['missed']} / {f['duplicates']}"]


def _lag_cells(f: dict[str, Any]) -> list[str]:
    """Lag p50, p99 and max."""
    return [ms(f["p50"]), ms(f["p99"]), ms(f["max"])]


def _fire_row(f: dict[str, Any], fl: dict[str, Any]) -> list[str]:
    """Section 1's figures for one backend, beside its floors."""
    over = _over_floor(f, fl)
    rel = None if over is None or not fl["floor_p99"] else f["p99"] / fl["floor_p99"]
    instant = fl.get("instant_p99")
    added = None if f["p99"] is None or instant is None else f["p99"] - instant
    return [
        *_slot_cells(f),
        f"{ms(fl.get('floor_p50'))} / {ms(fl.get('floor_p99'))}",
        f"{ms(fl.get('claim_p50'))} / {ms(fl.get('claim_p99'))}",
        *_lag_cells(f),
        ms(over),
        ratio(rel),
        f"{ms(fl.get('instant_p50'))} / {ms(instant)}",
        ms(added),
        _fire_verdict(f, over),
    ]


def _fire_defaults_row(f: dict[str, Any], fl: dict[str, Any]) -> list[str]:
    """The defaults table's figures for one backend, beside its distinct-key floor."""
    over = _over_floor(f, fl)
    per_slot = f.get("claims_per_slot")
    distinct = fl.get("distinct_p99")
    added = None if f["p99"] is None or distinct is None else f["p99"] - distinct
    return [
        *_slot_cells(f),
        *_lag_cells(f),
        ms(over),
        f"{ms(fl.get('distinct_p50'))} / {ms(distinct)}",
        ms(added),
        "–" if per_slot is None else f"{per_slot:.2f}",
        _fire_verdict(f, over),
    ]


def _over_floor(fire: dict[str, Any], floor: dict[str, Any]) -> float | None:
    """Lag p99 minus the one-client floor's p99, when both were measured."""
    if fire["p99"] is None or floor.get("floor_p99") is None:
        return None
    return float(fire["p99"] - floor["floor_p99"])


def _fire_verdict(fire: dict[str, Any], over: float | None) -> str:
    """The fire lag target: p99 within FIRE_TARGET_MS of the floor, nothing missed or run twice."""
    if over is None:
        return verdict(None)
    return verdict(over <= FIRE_TARGET_MS and fire["missed"] == 0 and fire["duplicates"] == 0)


def _fire_defaults(
    results: dict[str, Any], fire: dict[str, Any], floor: dict[str, Any]
) -> list[str]:
    """The fire lag again with every job option at its default: rank delays, not contention."""
    out = [
        "### With every option at its default",
        "",
        f"The same fleets and jobs over another {fire['window_s']} s, with no option set: each "
        "slot's preferred instance (rendezvous ranking over the instances' heartbeat records) "
        "claims at the slot and the others only after a rank delay, unless the winner's notice "
        "reaches them first; the window starts two heartbeats after the last instance started, "
        "so every instance has seen the others. What a user who sets nothing gets. Claims per "
        "slot: claims the backend answered (won + lost) per claim won, over each process's "
        "life. Target as above. Distinct-key floor: the same-instant floor as the defaults "
        "make it, each of the three processes claiming in one batch only the keys of the jobs "
        "it is the preferred instance for (the same ranking, instance ids and job names), so "
        "all three write at the instant where the same-key floor has one writer (SQLite: a "
        "process finding the write lock taken tries again every 0.1 ms); lag p99 − "
        "distinct-key floor p99 is what anarchon adds here. Shown beside the target, not "
        "instead of it.",
        "",
    ]
    rows = _per_backend(results, fire, floor, 11, _fire_defaults_row)
    return out + table(
        [
            "backend",
            "slots ran/due",
            "missed / dup",
            "lag p50",
            "lag p99",
            "lag max",
            "p99 − floor p99",
            "distinct-key floor p50 / p99",
            "p99 − distinct-key floor p99",
            "claims per slot",
            "target",
        ],
        rows,
    )


def burst_section(results: dict[str, Any]) -> list[str]:
    burst = results.get("burst")
    if burst is None:
        return []
    jobs = burst["jobs"]
    out = [
        f"## 2. Burst: {jobs:,} jobs due in the same second, 3 instances",
        "",
        "Reference: the raw primitive for the same number of keys in one batch by one client "
        "(one transaction / pipeline / statement; NATS: 256 publishes in flight). Target (issue "
        f"17): all started within {BURST_TARGET_S:g} s of the slot, zero duplicates; the core "
        f"alone within {CORE_BURST_TARGET_S:g} s.",
        "",
    ]
    rows = []
    for name in _names(results):
        why = _unavailable(results, name)
        b = burst.get(name)
        if why or b is None:
            rows.append([name, why or "failed", *["–"] * 9])
            continue
        if "not_ready" in b:
            rows.append(
                [name, "instances not ready in time: " + b["not_ready"][0][:80], *["–"] * 9]
            )
            continue
        ref = b["reference"].get("batch_s")
        done = None if b["all_ms"] is None else b["all_ms"] / 1000
        rows.append(
            [
                name,
                f"{b['ran']:,}/{b['jobs']:,}",
                f"{b['missed']} / {b['duplicates']}",
                secs(None if b["first_ms"] is None else b["first_ms"] / 1000),
                secs(None if b["p50_ms"] is None else b["p50_ms"] / 1000),
                secs(done),
                secs(ref),
                ratio(None if done is None or not ref else done / ref),
                " / ".join(f"{n:,}" for n in b["winners"]),
                _after_burst(b),
                verdict(
                    None
                    if done is None
                    else done <= BURST_TARGET_S and b["duplicates"] == 0 and b["missed"] == 0
                ),
            ]
        )
    core = burst.get("memory")
    if isinstance(core, dict) and core.get("all_ms") is not None:
        rows.append(
            [
                "memory: the core alone (1 instance)",
                f"{core['ran']:,}/{core['jobs']:,}",
                f"{core['missed']} / {core['duplicates']}",
                secs(core["first_ms"] / 1000),
                secs(core["p50_ms"] / 1000),
                secs(core["all_ms"] / 1000),
                "–",
                "–",
                " / ".join(f"{n:,}" for n in core["winners"]),
                _after_burst(core),
                verdict(core["all_ms"] / 1000 <= CORE_BURST_TARGET_S) + " (core target)",
            ]
        )
    out += table(
        [
            "backend",
            "ran/due",
            "missed / dup",
            "first start",
            "p50 start",
            "all started",
            "reference batch",
            "all / reference",
            "runs per instance",
            "after the burst: clean stops, warnings logged",
            "target",
        ],
        rows,
    )
    return [*out, ""]


def _after_burst(b: dict[str, Any]) -> str:
    text = f"{b.get('clean_exits', '?')}/{b.get('instances', 3)} stopped in {b['stop_s']:.0f} s"
    if "recorded" in b:
        # Counters of the instances that exited (a killed one writes none).
        text += f"; results recorded {b['recorded']:,}"
        text += f", refused {b['refused']:,}" if b.get("refused") else ""
        text += f", taken over {b['taken_over']:,}" if b.get("taken_over") else ""
    if b.get("warnings"):
        message, count = b["top_warning"]
        text += f"; {b['warnings']:,} warnings, most: {count:,}× “{message[:90]}”"
    return text


def rate_section(results: dict[str, Any]) -> list[str]:
    rate = results.get("rate")
    if rate is None:
        return []
    first = next((r for r in rate.values() if isinstance(r, dict) and "steps" in r), None)
    rounds = f"{first['rounds']} rounds of every step, {first['seconds']:g} s each" if first else ""
    out = [
        "## 3. Claim rate, 3 contending processes",
        "",
        f"The three processes run {rounds or 'alternated rounds of every step'}, a tenth of a "
        "second apart, the steps' order reversed every other round, all three on the same keys "
        "(every key contended three ways), each round on keys and jobs of its own: the raw "
        "primitive over keys 0, 1, 2 …, the same-work floor (the backend's own claim storage "
        "work, the script or statements a one-request claim sends, by a bare client loop: see "
        "`bench/same_work.py`) over slots 0, 1, 2 …, one-request `Backend.claim` calls over "
        "slots 0, 1, 2 … of other jobs, and on PostgreSQL the run record alone (the steps "
        "table below). Rate: a step's calls answered in all rounds over their time, three "
        "processes together; the ratios are those rates' (so every figure of the table comes "
        "from the same rounds, interleaved, rather than from one loop per step at different "
        f"moments). Target: claims ≥ {RATE_TARGET:.0%} of the primitive's rate. "
        "Same-work / primitive is what the claim's storage work leaves of the primitive; "
        "claim / same-work is what anarchon's Python leaves of the storage work. Keys won twice "
        "or by nobody: over all rounds.",
        "",
    ]
    rows = []
    for name in _names(results):
        why = _unavailable(results, name)
        r = rate.get(name)
        if why or r is None or "error" in r:
            rows.append([name, why or (r or {}).get("error", "failed")[:80], *["–"] * 9])
            continue
        p, w, c = (r["steps"][s] for s in ("primitive", "same_work", "claim"))
        rows.append(
            [
                name,
                f"{p['rate']:,.0f}/s",
                f"{w['rate']:,.0f}/s",
                f"{c['rate']:,.0f}/s",
                pct(r["share"]),
                verdict(None if r["share"] is None else r["share"] >= RATE_TARGET),
                pct(r["same_share"]),
                pct(r["python_share"]),
                f"{p['duplicates']} / {w['duplicates']} / {c['duplicates']}",
                f"{p['unclaimed']} / {w['unclaimed']} / {c['unclaimed']}",
            ]
        )
    out += table(
        [
            "backend",
            "primitive",
            "same-work floor",
            "claim",
            "claim / primitive",
            "target",
            "same-work / primitive",
            "claim / same-work",
            "keys won twice (prim / same / claim)",
            "keys nobody won (prim / same / claim)",
        ],
        rows,
    )
    return [*out, "", *ladder_section(results)]


LADDER_STEPS = {
    "primitive": "primitive",
    "record_pk": "run record, primary key only",
    "record_runs": "run record, the runs table",
    "same_work": "same-work floor",
    "claim": "claim",
}


def _share_range(step: str, shares: list[float]) -> str:
    # The primitive's own share is 100 % in every round: no range to show.
    if step == "primitive" or not shares:
        return "–"
    return f"{pct(min(shares))}–{pct(max(shares))}"


def ladder_section(results: dict[str, Any]) -> list[str]:
    """The steps of section 3's rounds one by one, the record ladder (bench/ladder.py)."""
    rate = results.get("rate") or {}
    done = [n for n in _names(results) if (rate.get(n) or {}).get("steps")]
    failed = [
        f"Record steps on {n} not run: {rate[n]['record_error']}"
        for n in _names(results)
        if (rate.get(n) or {}).get("record_error")
    ]
    if failed:
        failed.append("")
    if not done:
        return failed
    out = [
        "Record ladder: the rounds above step by step, what each part of a claim's storage "
        "work costs. A step's rate is its calls in all rounds over their time, its share of "
        "the primitive that rate over the primitive's (steadier from run to run than the "
        "median of the rounds), the ranges the lowest and highest round (a round's share: the "
        "step's rate over the same round's primitive rate). Single rounds are "
        "bimodal (the three processes in lockstep, every key waiting for the first writer's "
        "commit, or one ahead and the others finding its keys), hence many short rounds; "
        "*keys won by the leading process*: the share of a round's keys won by the process "
        "that won most (33 %: the three raced for every key; 100 %: one ran ahead), the median "
        "of the rounds. "
        "Each step does what the one before does and more. *Run record, primary key only* "
        "(PostgreSQL): the whole run record a won claim writes, by a bare client, `INSERT … "
        "ON CONFLICT DO NOTHING RETURNING` the record, a loser then reading the winner's (the "
        "backend's lookup by the primary key; a second round trip), into a copy of the runs "
        "table (its columns, defaults and identity) with only its primary key. *Run record, "
        "the runs table*: the same into the backend's own runs table, made by its migrations "
        "(+ its secondary indexes and status check). Neither takes a lock, a fence or sends a "
        "notice. *Same-work floor*: + the claim's own storage work (on PostgreSQL the claim "
        "function: the job's lock, the fence, the pause and overlap checks, and a winner's "
        "notice). *Claim*: + anarchon's Python. See `bench/ladder.py`.",
        "",
    ]
    rows = []
    for name in done:
        for step, r in rate[name]["steps"].items():
            rows.append(
                [
                    name,
                    LADDER_STEPS.get(step, step),
                    f"{r['rate']:,.0f}/s",
                    f"{min(r['rates']):,.0f}–{max(r['rates']):,.0f}/s",
                    pct(r["share"]),
                    _share_range(step, r["shares"]),
                    pct(r.get("lead")),
                    f"{r['duplicates']} / {r['unclaimed']}",
                ]
            )
    out += table(
        [
            "backend",
            "step",
            "rate (all rounds)",
            "rounds",
            "share of the primitive",
            "rounds",
            "keys won by the leading process",
            "keys won twice / nobody won",
        ],
        rows,
    )
    return [*out, "", *failed]


def idle_section(results: dict[str, Any]) -> list[str]:
    idle = results.get("idle")
    if idle is None:
        return []
    jobs = idle["jobs"]
    out = [
        f"## 4. Idle cost: {jobs:,} registered jobs on one instance",
        "",
        f"Default options, nothing due while measured; CPU and RSS over {idle['seconds']} s "
        "idle (psutil, /proc). Start-up: process spawn → `start()` returned → start-up work "
        "settled (catch-up look-ups on lease backends). Reference: the same instance with no "
        "job. Target: < 1 % of a core and < 100 MB.",
        "",
    ]
    rows = []
    for name in _names(results):
        why = _unavailable(results, name)
        r = idle.get(name)
        if why or r is None:
            rows.append([name, why or "failed", *["–"] * 6])
            continue
        full, empty = r.get(str(jobs), {}), r.get("0", {})
        if "cpu_pct" not in full:
            rows.append([name, "failed: " + str(full.get("log", ""))[:80], *["–"] * 6])
            continue
        ok = full["cpu_pct"] < IDLE_CPU_TARGET and full["rss_mb"] < IDLE_RSS_TARGET
        rows.append(
            [
                name,
                f"{secs(full.get('started_s'))} / {secs(full.get('settled_s'))}",
                f"{full['cpu_pct']:.2f} %",
                f"{full['rss_mb']:.0f} MB",
                f"{secs(empty.get('started_s'))}, {empty.get('cpu_pct', 0):.2f} %, "
                f"{empty.get('rss_mb', 0):.0f} MB",
                f"+{full['rss_mb'] - empty.get('rss_mb', 0):.0f} MB "
                f"({(full['rss_mb'] - empty.get('rss_mb', 0)) * 1024 / jobs:.1f} kB/job)",
                verdict(ok),
            ]
        )
    out += table(
        [
            "backend",
            "start-up: started / settled",
            "CPU (% of a core)",
            "RSS",
            "reference, 0 jobs: start, CPU, RSS",
            "cost of the jobs",
            "target",
        ],
        rows,
    )
    return [*out, ""]


def failover_section(results: dict[str, Any]) -> list[str]:
    fo = results.get("failover")
    if fo is None:
        return []
    out = [
        "## 5. Failover: kill -9 → takeover, SIGTERM → hand-over",
        "",
        "Three instances, one job with a sleeping handler; the runner is signalled as soon as "
        "its handler starts; delay = signal → attempt 2's handler start on another instance. "
        "kill -9: the backup waits for the lease to expire ('after expiry' = takeover start − "
        "(attempt 1's start + lease_ms)). SIGTERM with a small `grace_ms` and a long lease: "
        "the runner releases its lease and a backup takes over at once ('after grace' = delay "
        "− grace_ms).",
        "",
    ]
    rows = []
    for name in _names(results):
        why = _unavailable(results, name)
        if not results["targets"][name]["lease"]:
            rows.append(
                [name, "broker: no lease, no takeover or hand-over (by design)", *["–"] * 5]
            )
            continue
        r = fo.get(name)
        if why or r is None:
            rows.append([name, why or "failed", *["–"] * 5])
            continue
        kill, term = r.get("kill", {}), r.get("term", {})
        rows.append(
            [
                name,
                f"{kill.get('tries', 0)} / {term.get('tries', 0)}",
                f"{ms(kill.get('median_ms'), 0)} ({ms(kill.get('min_ms'), 0)}–"
                f"{ms(kill.get('max_ms'), 0)}), lease {kill.get('lease_ms')} ms",
                ratio(
                    None if kill.get("median_ms") is None else kill["median_ms"] / kill["lease_ms"]
                ),
                ms(kill.get("after_ref_median_ms"), 0),
                f"{ms(term.get('median_ms'), 0)} ({ms(term.get('min_ms'), 0)}–"
                f"{ms(term.get('max_ms'), 0)}), grace {term.get('grace_ms')} ms, "
                f"lease {term.get('lease_ms')} ms",
                ms(term.get("after_ref_median_ms"), 0),
            ]
        )
    out += table(
        [
            "backend",
            "tries (kill / term)",
            "kill -9 → takeover, median (min–max)",
            "median / lease_ms",
            "after expiry (median)",
            "SIGTERM → hand-over, median (min–max)",
            "after grace (median)",
        ],
        rows,
    )
    notes = [
        f"{name} {kind}: {'; '.join(r[kind]['notes'])}"
        for name, r in fo.items()
        for kind in ("kill", "term")
        if isinstance(r, dict) and r.get(kind, {}).get("notes")
    ]
    if notes:
        out += ["", "Notes: " + " | ".join(notes)]
    return [*out, ""]


PEER_NOTES = {
    "arq": "every worker enqueues job id `<name>:<unix ms>`; Redis keeps the first; runs at "
    ":SS.123456 by default and polls every 0.5 s",
    "procrastinate": "every worker's deferrer inserts `(task, periodic id, timestamp)` under a "
    "unique constraint; wakes 0.5 s after the due time by design; workers fetch via "
    "LISTEN/NOTIFY (concurrency 1)",
    "apscheduler": "each process runs its own scheduler over the shared table; the FAQ says "
    "this set-up is unsupported",
    "anarchon-redis": "leaderless per-slot claim (Lua), lease",
    "anarchon-postgres": "leaderless per-slot claim (one statement per batch), lease",
    "anarchon-sqlite": "leaderless per-slot claim (one transaction per batch), lease",
    "anarchon-nats": "leaderless per-slot claim (JetStream de-duplication), no lease",
}


def peers_section(results: dict[str, Any]) -> list[str]:
    peers = results.get("peers")
    if peers is None:
        return []
    out = [
        "## 6. Peers side by side: same work, same run",
        "",
        f"{peers['jobs']} jobs, each due every {peers['period_s']} s, three processes per "
        f"system, {peers['window_s']} s window; each system has its own second of the period. "
        "Defaults everywhere (anarchon with `jitter_ms=0`); peers from `bench/.venv-peers`. "
        "Lag: first start − due time. CPU: the three processes together, % of one core, over "
        "the window; CPU per slot: their CPU time over the window / slots that ran (idle work "
        "included). Ratio: lag p50 against anarchon on the same backend.",
        "",
    ]
    rows = []
    reference = {
        "redis": peers.get("anarchon-redis", {}).get("p50"),
        "postgres": peers.get("anarchon-postgres", {}).get("p50"),
    }
    for system, note in PEER_NOTES.items():
        r = peers.get(system)
        if r is None:
            why = peers["skipped"].get(system) or peers["errors"].get(system) or "failed"
            rows.append([system, "–", f"not run: {why}", *["–"] * 7, note])
            continue
        ref = reference.get(r["backend"])
        rel = (
            None
            if system.startswith("anarchon") or not ref or r["p50"] is None
            else (r["p50"] / ref)
        )
        rows.append(
            [
                system,
                r["backend"],
                f"{r['ran']}/{r['expected']}",
                f"{r['missed']} / {r['duplicates']}",
                ms(r["p50"]),
                ms(r["p99"]),
                ratio(rel),
                f"{r['cpu_pct']:.2f} %",
                ms(r.get("cpu_ms_per_slot"), 1),
                f"{r['rss_mb']:.0f} MB",
                note,
            ]
        )
    out += table(
        [
            "system",
            "store",
            "slots ran/due",
            "missed / dup",
            "lag p50",
            "lag p99",
            "p50 vs anarchon",
            "CPU (3 procs)",
            "CPU per slot",
            "RSS per proc",
            "how it decides",
        ],
        rows,
    )
    events = {s: r["events"] for s, r in peers.items() if isinstance(r, dict) and "events" in r}
    missed = {s: e for s, e in events.items() if any(e.values())}
    if missed:
        out += [
            "",
            "Scheduler events: "
            + "; ".join(
                f"{s}: {e['missed']} runs reported missed, {e['max_instances']} skipped for "
                "max_instances"
                for s, e in missed.items()
            ),
        ]
    if peers.get("problems"):
        out += ["", "Start-up problems: " + "; ".join(peers["problems"])]
    return [*out, ""]


def dashboard_section(results: dict[str, Any]) -> list[str]:
    board = results.get("dashboard")
    if board is None:
        return []
    out = [
        "## 7. Dashboard: server time of its pages (SQLite)",
        "",
    ]
    if "error" in board:
        return [*out, f"Not measured: {board['error']}", ""]
    out += [
        f"One SQLite file: {board['jobs']:,} jobs registered by three instances, 20 runs each "
        f"for the first 50, and {board['runs']:,} runs of a per-minute job (the SQLite "
        "backend keeps its newest 1,000 slots by default); seeded in "
        f"{board['seed_s']:.1f} s. Each page is called through the whole ASGI application in "
        f"one process of its own (routing, backend reads, rendering; no network): once (first: "
        f"templates compiled, connections opened), then {board['repeat']} times. Wall time "
        "(median, max) and the process's CPU time (median) per call. Registry TTL 0: every "
        "page reads the registry; 1000 ms (the default): pages within a second share one read. "
        f"Target: jobs page < {JOBS_PAGE_TARGET_MS:.0f} ms, a year's timeline "
        f"< {TIMELINE_YEAR_TARGET_MS:.0f} ms, by the median. Measured on {board['date']}, load "
        f"average {board['load_start']} at start and {board['load_end']} at the end.",
        "",
    ]
    rows = []
    for row in board["rows"]:
        target = row.get("target_ms")
        rows.append(
            [
                row["page"],
                f"`{row['path']}`",
                f"{row['registry_ttl_ms']} ms",
                ms(row["median_ms"], 0),
                ms(row["cpu_ms"], 0),
                ms(row["max_ms"], 0),
                ms(row["first_ms"], 0),
                f"{row['kib']:.0f} KiB",
                "–" if target is None else f"< {target:.0f} ms",
                verdict(None if target is None else row["median_ms"] < target),
            ]
        )
    out += table(
        [
            "page",
            "path",
            "registry TTL",
            "median",
            "CPU median",
            "max",
            "first",
            "size",
            "target",
            "met",
        ],
        rows,
    )
    return [*out, ""]


def history_section(results: dict[str, Any]) -> list[str]:
    found = results.get("history")
    if found is None:
        return []
    out = ["## History at size: reads of a job with many runs, and pruning", ""]
    if "error" in found:
        return [*out, f"Not measured: {found['error']}", ""]
    sizes = ", ".join(f"{n:,}" for n in found["sizes"])
    out += [
        f"One per-second job with {sizes} recorded runs (generated in the store, grown in turn); "
        f"each read called {found['samples']} times in turn after 10 warm-ups, through the "
        "backend's public calls (`explain` of a slot a minute old and of the oldest slot but "
        f"one). Target: p99 < {HISTORY_TARGET_MS:.0f} ms at 1,000,000 runs. "
        f"Measured on {found['date']}, load average {found['load_start']} at start and "
        f"{found['load_end']} at the end. Curve: [history.png](history.png).",
        "",
    ]
    rows = []
    for row in found["reads"]:
        at_size = row["rows"] >= 1_000_000
        rows.append(
            [
                row["backend"],
                f"{row['rows']:,}",
                row["read"],
                ms(row["p50_ms"]),
                ms(row["p99_ms"]),
                ms(row["max_ms"]),
                verdict(row["p99_ms"] < HISTORY_TARGET_MS) if at_size else "–",
            ]
        )
    out += table(["backend", "runs", "read", "p50", "p99", "max", "p99 < 10 ms at 1M"], rows)
    prune = found.get("prune") or []
    if prune:
        out += [
            "",
            f"Pruning: at the largest size, a backend keeping 1,000 slots runs the job's next "
            f"slots (a claim and a finish each, 10 a second); each result prunes the 100 "
            f"oldest slots. Target: no pause over {PRUNE_PAUSE_TARGET_MS:.0f} ms.",
            "",
        ]
        rows = [
            [
                p["backend"],
                f"{p['rows']:,} → {p['rows_after']:,}",
                str(p["cycles"]),
                ms(p["claim"]["p50_ms"]),
                ms(p["claim"]["max_ms"]),
                ms(p["finish"]["p50_ms"]),
                ms(p["finish"]["max_ms"]),
                ms(p["pause"]["max_ms"]),
                verdict(p["pause"]["max_ms"] < PRUNE_PAUSE_TARGET_MS),
            ]
            for p in prune
        ]
        out += table(
            [
                "backend",
                "runs",
                "slots run",
                "claim p50",
                "claim max",
                "finish p50",
                "finish max",
                "pause max",
                "met",
            ],
            rows,
        )
    for name, error in (found.get("errors") or {}).items():
        out += ["", f"{name}: not measured: {error}"]
    return [*out, ""]


def claims_section(results: dict[str, Any]) -> list[str]:
    """Claims per slot (bench/claims.py): rank delays at 3 to 100 schedulers."""
    cl = results.get("claims")
    if cl is None:
        return []
    out = [
        "## Claims per slot",
        "",
        f"Schedulers in one process, 5 every-second jobs each (`jitter_ms` 600), "
        f"{cl['seconds']:.0f} s of slots after a warm-up; claim requests the backend answered "
        'per slot, fire lag p50 / p99 (ms), missed and duplicate slots (must be 0). "dead": '
        "one more instance keeps a fresh record but never claims; the lag of the slots it is "
        "ranked first for is shown on its own. Target: ≤ 1.2 claims per slot.",
        "",
    ]
    rows = []
    for name in _names(results):
        why = _unavailable(results, name)
        got = cl["backends"].get(name)
        if why or got is None:
            rows.append([name, why or "failed", *["–"] * 6])
            continue
        for key, r in got.items():
            if "error" in r:
                rows.append([name, key, "failed: " + str(r["error"])[:60], *["–"] * 5])
                continue
            dead = "–"
            if r["ghost"]:
                dead = f"{r['ghost_slots']} slots, p50 {ms(r['ghost_lag_p50_ms'])}"
            rows.append(
                [
                    name,
                    f"{r['schedulers']}{' + dead' if r['ghost'] else ''}",
                    f"{r['claims_per_slot']:.2f}",
                    f"{ms(r['lag_p50_ms'])} / {ms(r['lag_p99_ms'])}",
                    dead,
                    f"{r['missed']} / {r['duplicates']}",
                    verdict(r["claims_per_slot"] <= 1.2 and not r["missed"] + r["duplicates"]),
                ]
            )
    out += table(
        [
            "backend",
            "schedulers",
            "claims / slot",
            "fire lag p50 / p99",
            "slots of the dead one",
            "missed / duplicates",
            "target",
        ],
        rows,
    )
    return [*out, ""]


def header(results: dict[str, Any]) -> list[str]:
    meta = results["meta"]
    lines = [
        "# anarchon benchmarks",
        "",
        f"Run `{meta['command']}` ({meta['mode']}) on {meta['date']}: {meta['cpu']}, "
        f"{meta['cores']} cores, load average {meta['load_start']} at start and "
        f"{meta.get('load_end', '?')} at the end; took {meta.get('elapsed_s', 0):.0f} s.",
        "",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items()) + ".",
        "",
        "How to reproduce and what each figure means: docs/benchmarks.md. Lag distributions: "
        "[lag.png](lag.png).",
        "",
        "Backends: "
        + "; ".join(
            f"{n} {'available' if t['available'] else 'not available: ' + str(t['reason'])}"
            for n, t in results["targets"].items()
        )
        + ".",
        "",
    ]
    return lines


def markdown(results: dict[str, Any]) -> str:
    lines = header(results)
    for section in (
        fire_section,
        burst_section,
        rate_section,
        idle_section,
        failover_section,
        peers_section,
        dashboard_section,
        history_section,
        curves.markdown,
        claims_section,
    ):
        lines += section(results)
    peaks = results.get("footprint") or {}
    if peaks:
        lines += [
            "Footprint (peak connections the bench's processes held, sampled every 0.25 s): "
            + "; ".join(
                f"{section}: "
                + ", ".join(f"{kind.replace('_', ' ')} {n}" for kind, n in sorted(p.items()))
                for section, p in peaks.items()
                if p
            )
            + ".",
            "",
        ]
    if results.get("cleanup_problems"):
        lines += ["Clean-up problems: " + "; ".join(results["cleanup_problems"]), ""]
    return "\n".join(lines)


def plot(results: dict[str, Any], path: Path) -> bool:
    """Write the lag distributions (empirical CDFs, log time axis); False if nothing to plot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fire, peers, floor = (
        results.get("fire") or {},
        results.get("peers") or {},
        results.get("floor") or {},
    )
    series_fire = {n: r["lags"] for n, r in fire.items() if isinstance(r, dict) and r.get("lags")}
    series_peers = {n: r["lags"] for n, r in peers.items() if isinstance(r, dict) and r.get("lags")}
    if not series_fire and not series_peers:
        return False
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    # One colour per store, the same in both panels; peers are dashed.
    colors = dict(zip(["sqlite", "redis", "postgres", "nats", "memory"], palette, strict=False))
    colors.update(arq=palette[5], procrastinate=palette[6], apscheduler=palette[7])
    ax = axes[0]
    for name, lags in series_fire.items():
        color = colors.get(name, "black")
        ys = [(k + 1) / len(lags) for k in range(len(lags))]
        ax.step([max(v, 0.01) for v in lags], ys, where="post", label=name, color=color)
        p99 = floor.get(name, {}).get("floor_p99")
        if p99:
            ax.axvline(p99, color=color, linestyle=":", linewidth=1)
    ax.set_xscale("log")
    ax.set_xlabel("slot → handler start (ms, log scale); dotted: floor p99")
    ax.set_ylabel("fraction of slots")
    ax.set_title("1. Fire lag per backend (jitter 0, 3 instances)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    ax = axes[1]
    for name, lags in series_peers.items():
        ys = [(k + 1) / len(lags) for k in range(len(lags))]
        style = "-" if name.startswith("anarchon") else "--"
        color = colors.get(name.removeprefix("anarchon-"), "black")
        ax.step(
            [max(v, 0.01) for v in lags],
            ys,
            where="post",
            label=name,
            linestyle=style,
            color=color,
        )
    ax.set_xscale("log")
    ax.set_xlabel("due time → handler start (ms, log scale)")
    ax.set_title("6. Peers, same work (3 processes each)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def plot_history(results: dict[str, Any], path: Path) -> bool:
    """Write the history curve: p50 and p99 of each read against the job's runs (log-log), one
    colour per backend, one line style per read; False if the run has no history figures."""
    found = results.get("history") or {}
    reads = found.get("reads") or []
    if not reads:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    colors = {"sqlite": palette[0], "postgres": palette[2]}
    styles = ["-", "--", "-.", ":"]
    names = list(dict.fromkeys(r["read"] for r in reads))
    fig, axes = plt.subplots(1, 2, figsize=(13, 5), sharey=True)
    for ax, key in zip(axes, ("p50_ms", "p99_ms"), strict=True):
        for backend in dict.fromkeys(r["backend"] for r in reads):
            for n, name in enumerate(names):
                points = sorted(
                    (r["rows"], r[key])
                    for r in reads
                    if r["backend"] == backend and r["read"] == name and r[key] is not None
                )
                if points:
                    ax.plot(
                        [x for x, _ in points],
                        [y for _, y in points],
                        marker="o",
                        linestyle=styles[n % len(styles)],
                        color=colors.get(backend, "black"),
                        label=f"{backend}: {name}",
                    )
        ax.axhline(HISTORY_TARGET_MS, color="grey", linestyle=":", linewidth=1)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("recorded runs of the job (log scale)")
        ax.set_title(f"{key.removesuffix('_ms')} (dotted: the 10 ms p99 target)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("latency (ms, log scale)")
    axes[1].legend(fontsize=8)
    fig.suptitle(f"History at size (load average {found.get('load_start', '?')} at start)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
