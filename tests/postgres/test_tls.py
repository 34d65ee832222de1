"""TLS on a real PostgreSQL server of the test's own (``initdb``, ``ssl=on``): a CA and
certificates made for the test, ``pg_hba.conf`` refusing connections without TLS and asking for
a client certificate signed by the CA (and one role's password). The backend migrates and claims
with ``sslmode=verify-full``; without the client certificate, the CA, TLS itself or the right
password, ``start()`` fails at once, saying why and what to change (never showing the password).
libpq does the TLS (not Python's ``ssl``), so Python 3.13's strict certificate checks do not
apply here."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlencode

import psycopg
import pytest

from anarchon import BackendError, BackendUnavailable, backend_from_url
from anarchon.backend import ClaimStatus
from anarchon.backends.postgres import PostgresBackend
from tests.chaos.servers import PrivatePostgres
from tests.pki import Pki, make_pki
from tests.ports import worker_port
from tests.postgres.test_postgres import SLOT, request

#: One port per pytest-xdist worker that no other test takes: a port probed free could be taken
#: by another worker or the fault runner while initdb runs, before the server listens on it.
PORTS = range(15600, 15616)  # one per pytest worker (see tests/ports.py)

#: Only TLS connections, and only with a client certificate the CA signed; the role USER also
#: gives its password, the others are trusted.
HBA = (
    "local all all trust\n"
    "hostssl all app 127.0.0.1/32 scram-sha-256 clientcert=verify-ca\n"
    "hostssl all all 127.0.0.1/32 trust clientcert=verify-ca\n"
    "hostnossl all all 127.0.0.1/32 reject\n"
)
USER = "app"
PASSWORD = "S3cret-pw"


@dataclass
class TlsPostgres:
    """A started server that takes TLS connections with client certificates from ``pki``'s CA."""

    pki: Pki
    port: int

    def url(
        self, files: dict[str, Path], sslmode: str = "verify-full", user: str = "postgres"
    ) -> str:
        query = urlencode({"sslmode": sslmode, **{k: str(v) for k, v in files.items()}})
        return f"postgresql://{user}@127.0.0.1:{self.port}/postgres?{query}"

    def every_file(self) -> dict[str, Path]:
        pki = self.pki
        return {"sslrootcert": pki.ca, "sslcert": pki.client_cert, "sslkey": pki.client_key}


@pytest.fixture(scope="module")
def tls_postgres() -> Iterator[TlsPostgres]:
    server = PrivatePostgres(port=worker_port(PORTS))
    try:
        # Under the server's directory (the postgres user reaches it); the server's key must be
        # that user's, the client's stays the test's (libpq checks both).
        pki = make_pki(server.root / "pki")
        os.chown(pki.server_key, server.root.stat().st_uid, server.root.stat().st_gid)
        server.settings = (
            "ssl=on",
            f"ssl_cert_file={pki.server_cert}",
            f"ssl_key_file={pki.server_key}",
            f"ssl_ca_file={pki.ca}",
        )
        (server.data / "pg_hba.conf").write_text(HBA)
        server.start()
        tls = TlsPostgres(pki, server.port)
        with psycopg.connect(tls.url(tls.every_file()), autocommit=True) as conn:
            conn.execute(f"CREATE ROLE {USER} LOGIN SUPERUSER PASSWORD '{PASSWORD}'")
        yield tls
    finally:
        server.close()


async def test_claims_over_tls_with_verify_full(tls_postgres: TlsPostgres) -> None:
    url = tls_postgres.url(tls_postgres.every_file())
    first, second = backend_from_url(url), backend_from_url(url)
    assert isinstance(first, PostgresBackend) and isinstance(second, PostgresBackend)
    await first.start()  # the first start also migrates the schema, over TLS
    await second.start()
    try:
        [won] = await first.claim([request(slot=SLOT)])
        [lost] = await second.claim([request(slot=SLOT, instance="i2")])
        assert won.status is ClaimStatus.WON
        assert lost.status is ClaimStatus.LOST
    finally:
        await first.stop()
        await second.stop()


@pytest.mark.parametrize(
    ("sslmode", "left_out", "why", "change"),
    [
        # pg_hba.conf asks for a client certificate; nothing to check the server's by; pg_hba.conf
        # refuses connections without TLS.
        ("verify-full", "sslcert", "requires a valid client certificate", "give sslcert"),
        ("verify-full", "sslrootcert", 'root certificate file "', "give sslrootcert"),
        ("disable", "", "pg_hba.conf rejects connection", "add a pg_hba.conf entry"),
    ],
)
async def test_a_refused_tls_connection_fails_start_saying_why(
    tls_postgres: TlsPostgres, sslmode: str, left_out: str, why: str, change: str
) -> None:
    files = {k: v for k, v in tls_postgres.every_file().items() if k != left_out}
    if left_out == "sslcert":
        del files["sslkey"]
    backend = backend_from_url(tls_postgres.url(files, sslmode))
    began = time.monotonic()
    with pytest.raises(BackendError, match="refused the connection: ") as failed:
        await asyncio.wait_for(backend.start(), 15)
    # Refused for good: at once, not after timeout_ms (5 s) as for a server that is down.
    assert time.monotonic() - began < 2.5
    assert not isinstance(failed.value, BackendUnavailable)
    assert why in str(failed.value) and change in str(failed.value)
    assert f"127.0.0.1:{tls_postgres.port}" in str(failed.value)
    await backend.stop()


async def test_a_password_refused_fails_start_saying_so_and_is_never_shown(
    tls_postgres: TlsPostgres, caplog: pytest.LogCaptureFixture
) -> None:
    files = tls_postgres.every_file()
    right = backend_from_url(tls_postgres.url(files, user=f"{USER}:{PASSWORD}"))
    await right.start()
    try:
        [won] = await right.claim([request(slot=SLOT + 1000)])
        assert won.status is ClaimStatus.WON
    finally:
        await right.stop()
    wrong = backend_from_url(tls_postgres.url(files, user=f"{USER}:Wr0ng-pw"))
    began = time.monotonic()
    with pytest.raises(BackendError, match="refused the connection: ") as failed:
        await asyncio.wait_for(wrong.start(), 15)
    assert time.monotonic() - began < 2.5, "refused for good: at once, not after timeout_ms"
    assert not isinstance(failed.value, BackendUnavailable)
    assert str(failed.value).endswith(
        f'FATAL: password authentication failed for user "{USER}"; fix the password '
        "(DSN, PGPASSWORD or ~/.pgpass)"
    ), str(failed.value)
    for shown in (str(failed.value), repr(right), repr(wrong), caplog.text):
        assert PASSWORD not in shown and "Wr0ng-pw" not in shown
    await wrong.stop()
