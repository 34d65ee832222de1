"""Pure helpers of the NATS backend: subject coverage and JetStream timestamps."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from anarchon.backends.nats._records import ack_fields, parse_time_ms
from anarchon.backends.nats._subjects import covers


@pytest.mark.parametrize(
    ("pattern", "subject", "expected"),
    [
        ("cron.>", "cron.>", True),
        (">", "cron.>", True),
        ("*.>", "cron.>", True),
        ("cron.>", "cron.sync.claims", True),
        ("cron.*.claims", "cron.sync.claims", True),
        ("cron.>", "cron", False),
        ("cron.sync.claims", "cron.>", False),
        ("cron.*", "cron.>", False),
        ("cron.*.claims", "cron.*.results", False),
        ("billing.>", "cron.>", False),
        ("cron.sync", "cron.sync.claims", False),
        ("cron.*.*", "cron.sync.claims", True),
    ],
)
def test_covers(pattern: str, subject: str, expected: bool) -> None:
    assert covers(pattern, subject) is expected


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("2026-12-02T17:51:45.174528297Z", 1796233905174),
        ("2026-12-02T17:51:45.1Z", 1796233905100),
        ("2026-12-02T17:51:45Z", 1796233905000),
        ("2026-12-02T19:51:45.999999999+02:00", 1796233905999),
    ],
)
def test_parse_time_ms(text: str, ms: int) -> None:
    assert parse_time_ms(text) == ms


def test_ack_fields_in_both_formats() -> None:
    v1 = "$JS.ACK.CRON.c1.1.812.3.1796233905174528297.7"
    v2 = "$JS.ACK.dom.hash.CRON.c1.1.812.3.1796233905174528297.7.rnd"
    assert ack_fields(v1) == ack_fields(v2) == (812, 1796233905174, 7)
    assert ack_fields(v1.encode()) == ack_fields(v2.encode()) == (812, 1796233905174, 7)
    assert ack_fields("_INBOX.x") is None
    assert ack_fields(b"_INBOX.x") is None
    assert ack_fields(b"$JS.ACK.CRON.c1.1.x.3.4.7") is None


async def test_an_outage_logs_once_with_the_shared_actions(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """nats-py calls disconnected_cb again on every failed reconnect; the backend says it once
    per outage, as ``backend_unavailable``, then ``backend_recovered``, on the logger
    ``anarchon.backends.nats``."""
    from types import SimpleNamespace
    from urllib.parse import urlsplit

    from anarchon.backends.nats import NatsBackend

    backend = NatsBackend("nats://127.0.0.1:4222")
    connection = backend._conn
    connection.nc = SimpleNamespace(connected_url=urlsplit("nats://127.0.0.1:4222"))  # type: ignore[assignment]
    caplog.set_level(logging.DEBUG, logger="anarchon.backends.nats")
    for _ in range(2):  # two outages
        for _ in range(3):  # three failed reconnect attempts each
            await connection._on_disconnected()
        await connection._on_reconnected()
    mine = [r for r in caplog.records if r.name == "anarchon.backends.nats"]
    actions = [getattr(r, "action", None) for r in mine if r.levelno >= logging.WARNING]
    assert actions == ["backend_unavailable", "backend_recovered"] * 2


@pytest.mark.parametrize(
    "fields",
    [
        {"slot": 1_800_000_000_000},
        {"slot": 1_800_000_000_000, "requested_by": "ops"},
        {"slot": 1_800_000_000_000, "key": "1800000000000-retry-2", "trigger": "retry"},
        {"slot": None, "trigger": "manual", "requested_by": "cli"},
    ],
)
def test_a_won_claim_is_answered_as_from_the_claim_it_stored(fields: dict[str, Any]) -> None:
    """The claim path builds a win straight from the request (``_won``): the same outcome as
    from the claim the request stores (``claim_of_request``)."""
    from anarchon.backend import ClaimRequest
    from anarchon.backends.nats._claims import _answer, _won
    from anarchon.backends.nats._records import claim_of_request
    from anarchon.kit import Trigger

    trigger = Trigger(str(fields.pop("trigger", "schedule")))
    req = ClaimRequest(
        job="sync", run_id="r" * 32, token="t" * 32, instance="i1", trigger=trigger, **fields
    )
    seq, now = 4711, 1_800_000_000_123
    assert _won(req, seq, now) == _answer(req, claim_of_request(req, seq, now), exact=False)
