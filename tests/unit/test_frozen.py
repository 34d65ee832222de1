"""anarchon._frozen.maker: the fast builder of the claim path's frozen records (and of the
executor's mutable one) gives exactly what the class's own constructor gives."""

from __future__ import annotations

import copy
import inspect
import pickle
from dataclasses import FrozenInstanceError, dataclass, fields, replace
from datetime import UTC, datetime
from typing import Any

import pytest

from anarchon import Overlap, Run, RunStatus, Trigger
from anarchon._frozen import maker
from anarchon.backend import ClaimNotice, ClaimOutcome, ClaimRequest, ClaimStatus, Ticket

NOW = datetime(2026, 12, 5, 6, 0, tzinfo=UTC)
TICKET = Ticket(
    job="a",
    slot=1_000,
    slot_key="1000",
    run_id="r",
    token="t",
    instance="i",
    trigger=Trigger.SCHEDULE,
    attempt=1,
    fence=7,
    started_at_ms=1_001,
    lease_ms=15_000,
    lease_expires_at_ms=16_001,
    backend_now_ms=1_001,
)
RUN = Run(
    job="a",
    slot=NOW,
    run_id="r",
    instance="i",
    trigger=Trigger.SCHEDULE,
    attempt=1,
    status=RunStatus.RUNNING,
    started_at=NOW,
    fence=7,
)
REQUEST = {"job": "a", "run_id": "r", "token": "t", "instance": "i"}
# Each record with some defaults left out (they must come out the same too).
CASES: list[tuple[type[Any], tuple[Any, ...], dict[str, Any]]] = [
    (ClaimRequest, (), {**REQUEST, "slot": 1_000, "trigger": Trigger.SCHEDULE, "lease_ms": 9}),
    (ClaimRequest, (), {**REQUEST, "slot": None, "trigger": Trigger.MANUAL, "key": "manual-x"}),
    (
        ClaimRequest,
        (),
        {
            **REQUEST,
            "slot": 1,
            "trigger": Trigger.SCHEDULE,
            "overlap": Overlap.SKIP,
            "skip_reason": "too late",
            "requested_by": "me",
        },
    ),
    (Ticket, (), {f.name: getattr(TICKET, f.name) for f in fields(Ticket)}),
    (
        Run,
        (),
        {
            "job": "a",
            "slot": NOW,
            "run_id": "r",
            "instance": "i",
            "attempt": 1,
            "trigger": Trigger.SCHEDULE,
            "status": RunStatus.SUCCEEDED,
            "started_at": NOW,
            "finished_at": NOW,
        },
    ),
    (ClaimOutcome, (), {"status": ClaimStatus.WON, "run": RUN, "ticket": TICKET}),
    (ClaimOutcome, (), {"status": ClaimStatus.LOST, "run": RUN, "backend_now_ms": 3}),
    (ClaimNotice, ("a", "1000", "i", 16_001), {}),
    (ClaimNotice, ("a", "1000", "i"), {"lease_expires_at_ms": None}),
]


@pytest.mark.parametrize(("cls", "args", "kwargs"), CASES)
def test_maker_builds_what_the_constructor_builds(
    cls: type[Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    make = maker(cls)
    made, built = make(*args, **kwargs), cls(*args, **kwargs)
    assert type(made) is cls
    assert made == built and hash(made) == hash(built) and repr(made) == repr(built)
    assert all(getattr(made, f.name) == getattr(built, f.name) for f in fields(cls))
    assert pickle.loads(pickle.dumps(made)) == built
    assert copy.copy(made) == built and replace(made) == built
    first = fields(cls)[0].name
    with pytest.raises(FrozenInstanceError):
        setattr(made, first, "changed")
    with pytest.raises(FrozenInstanceError):
        delattr(made, first)
    assert not hasattr(made, "__dict__")

    # The same parameters, kinds and defaults as the class's constructor.
    def shape(of: Any) -> list[tuple[str, Any, Any]]:
        return [(p.name, p.kind, p.default) for p in inspect.signature(of).parameters.values()]

    assert shape(make) == shape(cls)


def test_maker_builds_a_mutable_slotted_dataclass_as_its_constructor_does() -> None:
    @dataclass(eq=False, slots=True)
    class Mutable:
        a: int
        b: str = "b"
        _c: list[int] | None = None

    make = maker(Mutable)
    made, built = make(1, _c=[2]), Mutable(1, _c=[2])
    assert type(made) is Mutable and not hasattr(made, "__dict__")
    assert [getattr(made, f.name) for f in fields(Mutable)] == [1, "b", [2]]
    assert [getattr(built, f.name) for f in fields(Mutable)] == [1, "b", [2]]
    made.a = 5  # still mutable
    assert made.a == 5 and repr(made).endswith("Mutable(a=5, b='b', _c=[2])")
    assert [(p.name, p.default) for p in inspect.signature(make).parameters.values()] == [
        ("a", inspect.Parameter.empty),
        ("b", "b"),
        ("_c", None),
    ]


def test_maker_refuses_what_it_cannot_build_and_missing_arguments() -> None:
    @dataclass(frozen=True)
    class NoSlots:
        a: int

    @dataclass(frozen=True, slots=True)
    class Checked:
        a: int

        def __post_init__(self) -> None:
            raise ValueError

    for cls in (NoSlots, Checked, int):
        with pytest.raises(TypeError, match="not a slotted dataclass without __post_init__"):
            maker(cls)
    with pytest.raises(TypeError, match="token"):
        maker(ClaimRequest)(  # type: ignore[call-arg]
            job="a", slot=1, run_id="r", instance="i", trigger=Trigger.SCHEDULE
        )
