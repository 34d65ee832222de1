"""CronSchedule against a brute-force Vixie cron matcher, on random 5- and 6-field expressions.

``tests/oracles/vixie.py`` parses each field into the set of values it allows and walks the
calendar day by day; here random expressions (ranges, steps, ``N-N/s``, names, lists, ``L``,
``LW``, ``5L``, ``5#2``, macros, Vixie's day-of-month/day-of-week OR rule) are read both ways in UTC
from a random instant, and the first slots must agree one for one, through ``next_slot`` and
``slots`` alike. The default suite checks a few hundred expressions from a fixed seed;
``ANARCHON_CHAOS=1`` (``make chaos``) checks thousands, and ``ANARCHON_CRON_SEED`` picks the seed.
"""

from __future__ import annotations

import os
import random
from datetime import UTC, datetime

import pytest

from anarchon import CronSchedule, InvalidSchedule
from tests.oracles import vixie

CHAOS = os.environ.get("ANARCHON_CHAOS") == "1"
COUNT = 5000 if CHAOS else 400
SEED = int(os.environ.get("ANARCHON_CRON_SEED", "20270314"))
SLOTS = 60  # compared per expression
HORIZON_DAYS = 8 * 366  # a yearly job still shows a few slots
FROM = int(datetime(2020, 1, 1, tzinfo=UTC).timestamp())
TO = int(datetime(2040, 1, 1, tzinfo=UTC).timestamp())


def _value(rng: random.Random, field: vixie.Field) -> tuple[int, str]:
    value = rng.randint(field.low, field.high)
    index = value - field.first_name
    if field.names and 0 <= index < len(field.names) and rng.random() < 0.4:
        name = field.names[index]
        return value, rng.choice([name, name.lower(), name.title()])
    return value, str(value)


def _item(rng: random.Random, field: vixie.Field) -> str:
    kind = rng.choices(
        ["*/s", "a", "a-b", "a-b/s", "a-a/s", "a/s", "*"], weights=[3, 4, 3, 4, 2, 2, 1]
    )[0]
    step = rng.choice([1, 2, 3, 4, 5, 7, 10, 15, rng.randint(1, field.high + 3)])
    (a, a_text), (b, b_text) = _value(rng, field), _value(rng, field)
    if a > b:
        (a, a_text), (b, b_text) = (b, b_text), (a, a_text)
    return {
        "*": "*",
        "*/s": f"*/{step}",
        "a": a_text,
        "a-b": f"{a_text}-{b_text}",
        "a-b/s": f"{a_text}-{b_text}/{step}",
        "a-a/s": f"{a_text}-{a_text}/{step}",  # the form cronsim 2.8 misread
        "a/s": f"{a_text}/{step}",
    }[kind]


def _field(rng: random.Random, field: vixie.Field) -> str:
    roll = rng.random()
    if roll < 0.3:
        return "*"
    if field is vixie.DOM and roll < 0.36:
        return rng.choice(["L", "LW", f"{rng.randint(1, 28)},L"])
    if field is vixie.DOW and roll < 0.38:
        day = rng.randint(0, 7)
        return rng.choice(
            [f"{day}L", f"{day}#{rng.randint(1, 5)}", f"1-5,{day}#{rng.randint(1, 4)}"]
        )
    return ",".join(_item(rng, field) for _ in range(rng.choice([1, 1, 1, 2, 3])))


def random_expression(rng: random.Random) -> str:
    """A random valid expression: 5 or 6 fields, now and then a macro."""
    if rng.random() < 0.03:
        return rng.choice(sorted(vixie.MACROS))
    fields = [vixie.MINUTE, vixie.HOUR, vixie.DOM, vixie.MONTH, vixie.DOW]
    if rng.random() < 0.35:
        fields.insert(0, vixie.SECOND)
    return " ".join(_field(rng, field) for field in fields)


def _anarchon_slots(schedule: CronSchedule, after_ms: int, horizon_s: int) -> list[int]:
    found: list[int] = []
    slot = after_ms
    while len(found) < SLOTS:
        try:
            slot = schedule.next_slot(slot)
        except StopIteration:
            break
        if slot // 1000 >= horizon_s:
            break
        found.append(slot // 1000)
    return found


def check(expression: str, after_ms: int) -> str | None:
    """Compare one expression from one instant; return a description of the difference, if any."""
    spec = vixie.parse(expression)
    after_s = after_ms // 1000
    want = spec.utc_slots(after_s, SLOTS, HORIZON_DAYS)
    try:
        schedule = CronSchedule(expression)
    except InvalidSchedule as exc:
        if "never fires" in str(exc) and not spec.utc_slots(FROM, 1, 400 * 366):
            return None  # the calendar repeats every 400 years: it truly never fires
        return f"{expression!r}: refused ({exc}), the matcher fires at {want[:3]}"
    horizon_s = (after_s // 86400 + HORIZON_DAYS + 1) * 86400
    got = _anarchon_slots(schedule, after_ms, horizon_s)
    if got != want:
        at = next((i for i, (g, w) in enumerate(zip(got, want, strict=False)) if g != w), None)
        at = min(len(got), len(want)) if at is None else at
        return (
            f"{expression!r} after {_iso(after_s)}: slot #{at} anarchon "
            f"{[_iso(s) for s in got[at : at + 2]]} matcher {[_iso(s) for s in want[at : at + 2]]}"
        )
    if want:
        listed = schedule.slots(after_ms, want[-1] * 1000)
        if [s // 1000 for s in listed] != want:
            return f"{expression!r} after {_iso(after_s)}: slots() differs from next_slot()"
    return None


def _iso(epoch_s: int) -> str:
    return datetime.fromtimestamp(epoch_s, UTC).strftime("%Y-%m-%d %a %H:%M:%S")


def test_random_expressions_match_the_vixie_matcher() -> None:
    rng = random.Random(SEED)
    failures: list[str] = []
    slots = 0
    for _ in range(COUNT):
        expression = random_expression(rng)
        after_ms = rng.randint(FROM, TO) * 1000 + rng.choice([0, 0, 1, 999, rng.randint(0, 999)])
        problem = check(expression, after_ms)
        if problem:
            failures.append(problem)
        slots += SLOTS
    print(
        f"\nVixie matcher: seed {SEED}, {COUNT} expressions, up to {slots} slots compared, "
        f"{len(failures)} mismatches"
    )
    assert not failures, "\n".join(failures[:20])


@pytest.mark.parametrize(
    "expression",
    [
        "* 2 * * 4-4/3",  # issue 11: fired on Sundays too
        "0 0 1 10-10/2 *",  # issue 11: fired in December too
        "0 0 * * MON-MON/2",
        "0 0 * * mon-Mon/3",
        "0 0 * * 5-5/1",
        "0 0 * * 7-7/2",
        "0 0 * JAN-JAN/5 *",
        "0 59-59/30 * * * *",
        "0 0 31-31/2 * *",
        "0 0 5-20/5 * *",
        "0 0 * * 1-5/2",
        "0 0 * * 5/2",
        "0 0 * */5 *",
        "0 0 */10 * *",
        "0 0 L * 5L",
        "0 0 13 * FRI",
        "0 0 30 2 MON",  # OR-ed: the Mondays of February (cronsim 2.7 refused it)
        "0 0 31 4,6 */2",  # AND-ed, a day that never comes: refused as never firing
        "0 0 * * FRI#2,1L",
        "0 0 LW * *",
        "@weekly",
    ],
)
def test_ranges_and_steps_mean_what_vixie_means(expression: str) -> None:
    after_ms = int(datetime(2027, 1, 1, tzinfo=UTC).timestamp() * 1000) + 1
    assert check(expression, after_ms) is None
