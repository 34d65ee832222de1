"""The executor's fast builders of a run's context and handle give what the constructors give."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from anarchon import RunContext, Trigger
from anarchon._active import ActiveRun, new_active
from anarchon._context import new_context


def _slots(obj: Any) -> dict[str, Any]:
    """Every slot of ``obj`` (an unset one raises AttributeError: a builder that forgot it)."""
    return {name: getattr(obj, name) for name in type(obj).__slots__}


def _clock() -> int:
    return 7


def test_new_context_sets_every_slot_as_the_constructor_does() -> None:
    slot = datetime(2026, 12, 7, 1, 0, tzinfo=UTC)
    args: dict[str, Any] = {
        "job": "report",
        "slot": slot,
        "run_id": "a" * 32,
        "attempt": 2,
        "fence": 41,
        "trigger": Trigger.SCHEDULE,
        "instance": "host-1",
        "monotonic_ms": _clock,
        "retry": 3,
    }
    built = new_context(**args)
    assert type(built) is RunContext
    assert _slots(built) == _slots(RunContext(**args))
    assert built.retry == 3
    assert built.fence == 41
    assert not built.lease_lost
    assert repr(built) == repr(RunContext(**args))


def test_new_context_with_the_constructors_defaults() -> None:
    # A manual run: no slot, no fence, no clock, retry 0 (RunContext's own defaults).
    args: dict[str, Any] = {
        "job": "manual",
        "slot": None,
        "run_id": "b" * 32,
        "attempt": 1,
        "fence": None,
        "trigger": Trigger.MANUAL,
        "instance": "host-2",
    }
    built = new_context(**args, monotonic_ms=None, retry=0)
    assert _slots(built) == _slots(RunContext(**args))
    assert built.lease_lost is False
    assert built.should_stop is False


def test_new_active_sets_every_slot_as_the_constructor_does() -> None:
    ctx = new_context("report", None, "c" * 32, 1, 5, Trigger.SCHEDULE, "host-1", _clock, 0)
    job, ticket, executor = object(), object(), object()
    built = new_active(job, ticket, ctx, reserved=True, executor=executor)  # type: ignore[arg-type]
    made = ActiveRun(job=job, ticket=ticket, ctx=ctx, reserved=True, executor=executor)  # type: ignore[arg-type]
    assert type(built) is ActiveRun
    assert _slots(built) == _slots(made)
    assert built.reserved is True
    assert built.task is None
    assert built.deadline == 0
