"""``anarchon.kit.calls.Outage``: a backend's outage is logged once when it begins and once when
it ends, with the same actions and levels on every backend (docs/logging.md's table)."""

from __future__ import annotations

import logging

import pytest

from anarchon.errors import BackendUnavailable
from anarchon.kit.calls import Outage

LOGGER = logging.getLogger("anarchon.backends.toy")


def test_an_outage_is_logged_once_when_it_begins_and_once_when_it_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER.name)
    outage = Outage(LOGGER, "Toy 10.0.0.5:1")
    outage.answered()  # all is well: nothing logged
    assert not outage.down and caplog.records == []
    for n in range(3):
        outage.failed(BackendUnavailable(f"Toy 10.0.0.5:1: no answer within 5 s\nattempt {n}"))
    assert outage.down
    outage.answered()
    outage.answered()
    assert not outage.down
    seen = [(r.levelno, getattr(r, "action", None), r.getMessage()) for r in caplog.records]
    assert seen == [
        (
            logging.WARNING,
            "backend_unavailable",
            "Toy 10.0.0.5:1: no answer within 5 s; calls fail until it answers again",
        ),
        (logging.WARNING, "backend_recovered", "Toy 10.0.0.5:1 answers again"),
    ]


def test_a_second_outage_is_logged_again(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER.name)
    outage = Outage(LOGGER, "Toy")
    for _ in range(2):
        outage.failed(TimeoutError())  # no message: its type names it
        outage.answered()
    assert [r.getMessage() for r in caplog.records] == [
        "TimeoutError; calls fail until it answers again",
        "Toy answers again",
    ] * 2
