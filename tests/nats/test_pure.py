"""Pure helpers of the NATS backend: subject coverage, JetStream timestamps, the buckets'
replicas against a scripted API, and which failed connections are transient."""

from __future__ import annotations

import logging
import socket
import ssl
from typing import Any

import nats.errors
import pytest

from anarchon.backends.nats._errors import connect_error
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
            await connection._opener._on_disconnected()
        await connection._opener._on_reconnected()
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


async def test_buckets_follow_the_stream_replicas_and_a_refused_update_is_kept(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """align_buckets against a scripted API (the cluster test in test_processes.py runs it on
    real servers): a missing bucket is left alone, one with the stream's replicas is not
    touched, one with others is updated, and one whose update is refused (a user without
    STREAM.UPDATE on it) is kept and logged at WARNING; start() goes on."""
    from anarchon.backends.nats import _errors as errors
    from anarchon.backends.nats._errors import JetStreamError
    from anarchon.backends.nats._stream import align_buckets

    replicas = {"KV_a": None, "KV_b": 3, "KV_c": 1, "KV_d": 1}
    updates: list[tuple[str, int]] = []

    async def api(subject: str, body: dict[str, Any] | None) -> dict[str, Any]:
        verb, name = subject.removeprefix("$JS.API.").rsplit(".", 1)
        if verb == "STREAM.INFO":
            if replicas[name] is None:
                raise JetStreamError("not found", code=404, err_code=errors.STREAM_NOT_FOUND)
            return {"config": {"name": name, "num_replicas": replicas[name], "history": 1}}
        assert verb == "STREAM.UPDATE" and body is not None
        assert body["name"] == name and body["history"] == 1  # the rest of the config is kept
        if name == "KV_d":
            raise JetStreamError("permissions violation", code=403, err_code=None)
        updates.append((name, body["num_replicas"]))
        return {"config": body}

    caplog.set_level(logging.INFO, "anarchon.backends.nats")
    await align_buckets(api, "CRON", list(replicas), 3)
    assert updates == [("KV_c", 3)]
    logged = {
        (r.levelname, getattr(r, "action", ""), getattr(r, "stream", "")) for r in caplog.records
    }
    assert logged == {
        ("INFO", "bucket_updated", "KV_c"),
        ("WARNING", "bucket_update_failed", "KV_d"),
    }
    assert "permissions violation" in caplog.text and "claims fail closed" in caplog.text


@pytest.mark.parametrize(
    ("cause", "transient"),
    [
        (ConnectionRefusedError(111, "Connect call failed"), True),
        (ConnectionResetError("Connection lost"), True),
        (socket.gaierror(-2, "Name or service not known"), True),
        (TimeoutError("no connection within 8 s"), True),
        (nats.errors.TimeoutError(), True),
        (nats.errors.NoServersError(), True),
        (nats.errors.UnexpectedEOF(), True),
        (ssl.SSLEOFError(8, "EOF occurred in violation of protocol"), True),
        (nats.errors.AuthorizationError(), False),
        (nats.errors.Error("nats: 'Authorization Violation'"), False),
        (nats.errors.InvalidUserCredentialsError(), False),
        (nats.errors.SecureConnRequiredError(), False),
        (nats.errors.SecureConnWantedError(), False),
        (ssl.SSLCertVerificationError(1, "certificate verify failed"), False),
        (ssl.SSLError(1, "tlsv13 alert certificate required"), False),
        (nats.errors.ProtocolError(), False),
    ],
)
def test_an_unreachable_server_is_unavailable_and_a_refusal_is_not(
    cause: BaseException, transient: bool
) -> None:
    from anarchon.errors import BackendError, BackendUnavailable

    error = connect_error(cause, "cannot connect")
    assert isinstance(error, BackendError)
    assert isinstance(error, BackendUnavailable) == transient
