"""TLS on a real redis-server (``rediss://``): a CA and certificates made for the test, a server
that requires client certificates, an ACL user with a password. The backend claims and
subscribes through it, from a URL and from a client the caller made (and its copy); a missing
CA or client certificate fails ``start()`` within seconds, saying why, and the password appears
nowhere."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlencode

import pytest

from anarchon import BackendUnavailable, RunStatus, backend_from_url
from anarchon.backend import ClaimNotice, ClaimStatus, FinishRequest
from anarchon.backends.redis import RedisBackend
from tests.pki import Pki, make_pki
from tests.redis.servers import free_port, redis_server
from tests.redis.test_scripts import SLOT, claim_request
from tests.unit.core_helpers import until

USER = "anarchon"
PASSWORD = "S3cret-pw"
LOGGER = "anarchon.backends.redis"


@dataclass
class TlsServer:
    """A redis-server with a TLS port that requires client certificates from ``pki``'s CA."""

    pki: Pki
    port: int

    def url(self, files: dict[str, Path]) -> str:
        """The backend's URL with ``USER``/``PASSWORD`` and the TLS files given as
        ``ssl_ca_certs=...`` and the like (redis-py's own URL options)."""
        query = urlencode({"prefix": f"tls{self.port}:", **{k: str(v) for k, v in files.items()}})
        return f"rediss://{USER}:{PASSWORD}@127.0.0.1:{self.port}/0?{query}"

    def every_file(self) -> dict[str, Path]:
        pki = self.pki
        return {
            "ssl_ca_certs": pki.ca,
            "ssl_certfile": pki.client_cert,
            "ssl_keyfile": pki.client_key,
        }


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[TlsServer]:
    pki = make_pki(tmp_path / "pki")
    port = free_port()
    tls = [
        "--tls-port", str(port),
        "--tls-cert-file", str(pki.server_cert),
        "--tls-key-file", str(pki.server_key),
        "--tls-ca-cert-file", str(pki.ca),
        # The default user (no password) on the plain port lets the helper see the server is up;
        # the backend signs in as USER on the TLS port.
        "--user", USER, "on", f">{PASSWORD}", "~*", "&*", "+@all",
    ]  # fmt: skip
    with redis_server(tmp_path, *tls):
        yield TlsServer(pki, port)


async def test_claims_and_notices_over_tls_from_a_url(
    tls_server: TlsServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    url = tls_server.url(tls_server.every_file())
    first, second = backend_from_url(url), backend_from_url(url)
    assert isinstance(first, RedisBackend) and isinstance(second, RedisBackend)
    await first.start()
    await second.start()
    try:
        # The subscriptions (finishes, claim notices) go over TLS too.
        notices: list[ClaimNotice] = []
        finished: list[str] = []
        await second.subscribe(lambda job, key, released: finished.append(key))
        assert await second.subscribe_claims(notices.extend)
        [won] = await first.claim([claim_request(slot=SLOT)])
        [lost] = await second.claim([claim_request(slot=SLOT, instance="i2")])
        assert won.status is ClaimStatus.WON and won.ticket is not None
        assert lost.status is ClaimStatus.LOST
        await first.finish_many([FinishRequest(won.ticket, RunStatus.SUCCEEDED, None)])
        await until(lambda: notices, 10, "the claim notice")
        assert [n.slot_key for n in notices] == [str(SLOT)]
        await until(lambda: finished, 10, "the finish")
        assert finished == [str(SLOT)]
    finally:
        await first.stop()
        await second.stop()
    assert PASSWORD not in repr(first) and f"{USER}:***@" in repr(first)
    assert PASSWORD not in caplog.text


async def test_claims_over_tls_on_the_callers_client_and_its_copy(tls_server: TlsServer) -> None:
    """A client the caller made; the backend's clone (the lease keeper thread's, on a copy of
    the client) keeps its TLS options."""
    from redis.asyncio import Redis

    pki = tls_server.pki
    client = Redis(
        host="127.0.0.1",
        port=tls_server.port,
        username=USER,
        password=PASSWORD,
        ssl=True,
        ssl_ca_certs=str(pki.ca),
        ssl_certfile=str(pki.client_cert),
        ssl_keyfile=str(pki.client_key),
    )
    backend = RedisBackend(client=client, prefix=f"tls{tls_server.port}:")
    try:
        await backend.start()
        clone = backend.clone()
        assert clone is not None
        await clone.start()
        try:
            [won] = await backend.claim([claim_request(slot=SLOT + 1000)])
            [lost] = await clone.claim([claim_request(slot=SLOT + 1000, instance="i2")])
        finally:
            await clone.stop()
        assert won.status is ClaimStatus.WON and lost.status is ClaimStatus.LOST
        await backend.stop()
        assert await client.ping()  # the caller's client is left open
    finally:
        await client.aclose()


@pytest.mark.parametrize(
    ("left_out", "why"),
    [
        ("ssl_ca_certs", "CERTIFICATE_VERIFY_FAILED"),  # the server's certificate is not trusted
        # The server wants a client certificate: under TLS 1.3 the client learns it from an
        # alert or a reset connection, whichever the timing gives: only the kind of error is sure.
        ("ssl_certfile", "ConnectionError"),
    ],
)
async def test_a_missing_ca_or_client_certificate_fails_start_at_once(
    tls_server: TlsServer, caplog: pytest.LogCaptureFixture, left_out: str, why: str
) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    files = tls_server.every_file()
    del files[left_out]
    if left_out == "ssl_certfile":
        del files["ssl_keyfile"]
    backend = backend_from_url(tls_server.url(files))
    began = time.monotonic()
    with pytest.raises(BackendUnavailable, match="cannot start the Redis backend") as failed:
        await backend.start()
    assert time.monotonic() - began < 10
    assert why in str(failed.value)
    assert f"127.0.0.1:{tls_server.port}" in str(failed.value)
    assert PASSWORD not in str(failed.value) and PASSWORD not in caplog.text
    await backend.stop()
