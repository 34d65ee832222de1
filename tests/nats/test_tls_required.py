"""TLS asked for is TLS or nothing (QA probe tlsdown.py): a ``tls://`` URL, or ``ca_file`` /
``cert_file``, against a server without TLS used to connect in plain text, sending the password
of ``tls://admin:pw@host`` unencrypted. Now ``start()`` refuses before anything is sent."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from anarchon import BackendError, BackendUnavailable
from anarchon.backends.nats import NatsBackend
from tests.nats.servers import SHARED_URL, unique_names
from tests.pki import make_pki

PASSWORD = "Pl41n-text-pw"
PLAIN = SHARED_URL.removeprefix("nats://")  # the shared server: JetStream, no TLS


async def _refused(backend: NatsBackend) -> BackendError:
    began = time.monotonic()
    with pytest.raises(BackendError) as failed:
        await backend.start()
    assert time.monotonic() - began < 10, "refused at once, not after the retries"
    assert not isinstance(failed.value, BackendUnavailable), "refused for good"
    assert f"the server at {PLAIN} offers no TLS, but TLS was asked for" in str(failed.value)
    assert PASSWORD not in str(failed.value)
    return failed.value


@pytest.mark.parametrize("tls_files", [False, True])
async def test_tls_asked_for_refuses_a_server_without_tls(tmp_path: Path, tls_files: bool) -> None:
    stream, prefix = unique_names()
    files: dict[str, Any] = {}
    if tls_files:
        pki = make_pki(tmp_path / "pki")
        files = {"ca_file": str(pki.ca), "cert_file": str(pki.client_cert),
                 "key_file": str(pki.client_key)}  # fmt: skip
    await _refused(NatsBackend(f"tls://{PLAIN}", stream=stream, prefix=prefix, **files))
    if tls_files:  # TLS files ask for TLS on a nats:// URL too
        await _refused(NatsBackend(f"nats://{PLAIN}", stream=stream, prefix=prefix, **files))


async def test_the_password_is_not_sent_to_a_server_without_tls() -> None:
    """A stand-in server that offers no TLS and wants credentials records what it is sent."""
    received = bytearray()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        info = {"server_id": "FAKE", "version": "2.9.0", "host": "127.0.0.1", "port": port,
                "max_payload": 1048576, "proto": 1, "headers": True, "auth_required": True,
                "jetstream": True}  # fmt: skip
        writer.write(f"INFO {json.dumps(info)}\r\n".encode())
        await writer.drain()
        try:
            while chunk := await asyncio.wait_for(reader.read(4096), 5):
                received.extend(chunk)
        except (TimeoutError, ConnectionError):
            pass
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        backend = NatsBackend(f"tls://admin:{PASSWORD}@127.0.0.1:{port}")
        with pytest.raises(BackendError, match=f"server at 127.0.0.1:{port} offers no TLS"):
            await backend.start()
        await backend.stop()
    finally:
        server.close()
        await server.wait_closed()
    assert PASSWORD.encode() not in received, bytes(received)
