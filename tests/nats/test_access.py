"""Credentials and TLS on real servers (issue 10, item 8): a CA and certificates made for the
test, a user/password server, a token server, an operator-mode server with a ``.creds`` file;
and no password, token or seed in any message, repr or log line, from the CLI either.
"""

from __future__ import annotations

import itertools
import logging
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from anarchon import (
    BackendError,
    BackendUnavailable,
    InvalidOption,
    backend_from_url,
)
from anarchon.backend import ClaimStatus
from anarchon.backends.nats import NatsBackend
from tests.nats.conftest import VERSIONS
from tests.nats.servers import BINARIES, NatsServer, configured_server, connect, unique_names
from tests.nats.test_claims import SLOT, request
from tests.pki import make_pki
from tests.refusals import COMMANDS, HOW, refused_cli, refused_start

ROOT = Path(__file__).resolve().parents[2]
PASSWORD = "S3cret-pw"
TOKEN = "T0ken-9f2c"
LOGGER = "anarchon.backends.nats"
SLOTS = itertools.count()


@pytest.fixture(params=VERSIONS)
def conf_server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[str], Any]]:
    """``conf_server(body)``: a started server of each version with ``body`` in its config."""
    started: list[NatsServer] = []

    def start(body: str) -> NatsServer:
        server = configured_server(tmp_path / f"s{len(started)}", BINARIES[request.param], body)
        started.append(server)
        return server.start()

    try:
        yield start
    finally:
        for server in started:
            server.stop()


async def claims_once(backend: NatsBackend) -> None:
    await backend.start()
    try:
        [won] = await backend.claim([request(slot=SLOT + 1000 * next(SLOTS))])
        assert won.status is ClaimStatus.WON
    finally:
        await backend.stop()


async def test_tls_with_the_ca_and_a_client_certificate(
    conf_server: Callable[[str], NatsServer], tmp_path: Path
) -> None:
    pki = make_pki(tmp_path / "pki")
    server = conf_server(
        f'tls {{\n  cert_file: "{pki.server_cert}"\n  key_file: "{pki.server_key}"\n'
        f'  ca_file: "{pki.ca}"\n  verify: true\n  timeout: 2\n}}'
    )
    url = f"tls://127.0.0.1:{server.port}"
    stream, prefix = unique_names()
    files: dict[str, Any] = {"ca_file": str(pki.ca), "cert_file": str(pki.client_cert)}
    await claims_once(
        NatsBackend(url, stream=stream, prefix=prefix, key_file=str(pki.client_key), **files)
    )
    # The URL form: the same files as query parameters.
    query = "&".join(f"{k}={v}" for k, v in {**files, "key_file": pki.client_key}.items())
    from_url = backend_from_url(f"{url}?stream={stream}&prefix={prefix}&{query}")
    assert isinstance(from_url, NatsBackend)
    await claims_once(from_url)
    # Without the CA the server's certificate is not trusted; without a client certificate the
    # server refuses the connection. Both fail within seconds, saying where.
    refused: list[dict[str, Any]] = [
        {"cert_file": str(pki.client_cert), "key_file": str(pki.client_key)},
        {"ca_file": str(pki.ca)},
    ]
    for options in refused:
        backend = NatsBackend(url, stream=stream, prefix=prefix, **options)
        began = time.monotonic()
        with pytest.raises(BackendError, match=rf"cannot connect to NATS at {url}: ") as failed:
            await backend.start()
        assert time.monotonic() - began < 10
        # Refused for good (BackendError), unless the server dropped the client without a
        # certificate before the handshake's alert reached it: that reads as a reset.
        reset = "ConnectionResetError" in str(failed.value)
        assert isinstance(failed.value, BackendUnavailable) == reset, failed.value
        if "ca_file" not in options:
            assert "CERTIFICATE_VERIFY_FAILED" in str(failed.value)
            assert not reset


@pytest.mark.parametrize(
    ("options", "text"),
    [
        ({"ca_file": "/nonexistent/ca.pem"}, r"ca_file='/nonexistent/ca.pem' is not a readable"),
        ({"key_file": __file__}, r"key_file=.* needs cert_file"),
        ({"cert_file": __file__}, r"cert_file=.* is not a usable client certificate"),
        ({"ca_file": __file__}, r"ca_file=.* holds no usable CA certificate"),
        ({"creds": "/nonexistent/x.creds"}, r"creds='/nonexistent/x.creds' is not a readable"),
        ({"user": "admin"}, "user and password go together; password is missing"),
        ({"token": "t", "user": "u", "password": "p"}, "one kind of NATS credentials"),
        ({"token": ""}, r"token=\*\*\* must be a non-empty string"),
    ],
)
def test_bad_credential_and_tls_options_are_refused(options: dict[str, Any], text: str) -> None:
    with pytest.raises(InvalidOption, match=text):
        NatsBackend(**options)


def test_a_misspelt_option_is_a_type_error_naming_the_constructor() -> None:
    with pytest.raises(TypeError, match=r"NatsBackend\.__init__\(\) got an unexpected .*'pasword'"):
        NatsBackend(user="admin", pasword=PASSWORD)  # type: ignore[call-arg]


async def test_credentials_and_a_callers_connection_do_not_mix() -> None:
    nc = await connect("nats://127.0.0.1:4222")
    try:
        with pytest.raises(InvalidOption, match="user, password apply only when anarchon opens"):
            NatsBackend(connection=nc, user="admin", password=PASSWORD)
    finally:
        await nc.close()


def _no_secret(*texts: str) -> None:
    for text in texts:
        assert PASSWORD not in text and TOKEN not in text, text


async def test_user_and_password(
    conf_server: Callable[[str], NatsServer], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    server = conf_server(f'authorization {{\n  user: admin\n  password: "{PASSWORD}"\n}}')
    stream, prefix = unique_names()
    host = f"127.0.0.1:{server.port}"
    in_url = backend_from_url(f"nats://admin:{PASSWORD}@{host}?stream={stream}&prefix={prefix}")
    assert isinstance(in_url, NatsBackend)
    await claims_once(in_url)
    options = NatsBackend(f"nats://{host}", stream=stream, prefix=prefix, user="admin",
                          password=PASSWORD)  # fmt: skip
    await claims_once(options)
    wrong = [
        NatsBackend(f"nats://admin:{PASSWORD}x@{host}", stream=stream, prefix=prefix),
        NatsBackend(f"nats://{host}", user="admin", password=f"{PASSWORD}x"),
    ]
    for backend in wrong:
        with pytest.raises(BackendError, match="cannot connect to NATS") as failed:
            await backend.start()
        assert "Authorization" in str(failed.value) or "authorization" in str(failed.value)
        assert not isinstance(failed.value, BackendUnavailable), "refused for good"
        _no_secret(str(failed.value), repr(backend))
    _no_secret(repr(in_url), repr(options), caplog.text)


async def test_token(
    conf_server: Callable[[str], NatsServer], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    server = conf_server(f'authorization {{\n  token: "{TOKEN}"\n}}')
    stream, prefix = unique_names()
    host = f"127.0.0.1:{server.port}"
    in_url = backend_from_url(f"nats://{TOKEN}@{host}?stream={stream}&prefix={prefix}")
    assert isinstance(in_url, NatsBackend)
    await claims_once(in_url)
    await claims_once(NatsBackend(f"nats://{host}", stream=stream, prefix=prefix, token=TOKEN))
    for backend in (
        NatsBackend(f"nats://{TOKEN}x@{host}", stream=stream, prefix=prefix),
        NatsBackend(f"nats://{host}", token=f"{TOKEN}x"),
        NatsBackend(f"nats://{host}"),
    ):
        with pytest.raises(BackendError, match="cannot connect to NATS") as failed:
            await backend.start()
        assert not isinstance(failed.value, BackendUnavailable), "refused for good"
        _no_secret(str(failed.value), repr(backend))
    _no_secret(repr(in_url), caplog.text)


@pytest.mark.parametrize(
    ("url", "named"),
    [
        (f"nats://admin:{PASSWORD}@127.0.0.1:4222/?strem=X", "strem"),
        (f"nats://{TOKEN}@127.0.0.1:4222?stream=X&passwd={PASSWORD}", "passwd"),
        (f"nats://admin:{PASSWORD}@127.0.0.1:4222/?history_size=many", "history_size='many'"),
        (f"nats://admin:{PASSWORD}@127.0.0.1:4222/CRON", "has a path"),
    ],
)
def test_the_cli_never_prints_a_password_or_token(url: str, named: str) -> None:
    """Before: ``anarchon history x --backend 'nats://admin:S3cret@...?strem=X'`` printed the
    URL, password and all, in its error."""
    done = subprocess.run(
        [sys.executable, "-m", "anarchon", "history", "x", "--backend", url],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert named in done.stderr
    _no_secret(done.stdout, done.stderr)
    assert "127.0.0.1:4222" in done.stderr, "the message still says which server"


async def test_a_creds_file_on_an_operator_mode_server(
    conf_server: Callable[[str], NatsServer], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from tests.nats.jwts import make_operator

    caplog.set_level(logging.DEBUG, logger=LOGGER)
    operator = make_operator(tmp_path / "nsc")
    server = conf_server(operator.config)
    stream, prefix = unique_names()
    await claims_once(
        NatsBackend(server.url, stream=stream, prefix=prefix, creds=str(operator.creds))
    )
    in_url = backend_from_url(
        f"{server.url}?stream={stream}&prefix={prefix}&creds={operator.creds}"
    )
    assert isinstance(in_url, NatsBackend)
    await claims_once(in_url)
    stranger = NatsBackend(server.url, creds=str(operator.stranger_creds))
    began = time.monotonic()
    with pytest.raises(BackendError, match=r"cannot connect to NATS.*Authorization Viol") as e:
        await stranger.start()
    assert not isinstance(e.value, BackendUnavailable), "refused for good"
    assert time.monotonic() - began < 5
    seeds = [line for p in (operator.creds, operator.stranger_creds)
             for line in p.read_text().splitlines() if line.startswith("SU")]  # fmt: skip
    assert len(seeds) == 2
    for seed in seeds:
        assert seed not in caplog.text


REFUSED_ADVICE = (
    "Error: 'Authorization Violation'. The server refused the credentials: give the user and "
    "password, the token or the .creds file its authorization accepts (in the URL or "
    "NatsBackend's options)"
)


def _refused_urls(server: NatsServer) -> list[tuple[str, str]]:
    """URLs whose credentials ``server`` (user admin, PASSWORD) refuses, each as shown."""
    host = f"127.0.0.1:{server.port}"
    return [
        (f"nats://{host}", f"nats://{host}"),
        (f"nats://admin:{PASSWORD}x@{host}", f"nats://admin:***@{host}"),
    ]


async def test_refused_credentials_fail_at_once_saying_what_to_change(
    conf_server: Callable[[str], NatsServer],
) -> None:
    """A server that refuses the credentials (none, or a wrong password) fails the start at
    once, every option at its default: the server's words and what to change, not the advice
    for a server that is down ("Check that nats-server runs there, with JetStream enabled ...",
    before)."""
    server = conf_server(f'authorization {{\n  user: admin\n  password: "{PASSWORD}"\n}}')
    for url, shown in _refused_urls(server):
        for how in HOW:
            error, took = await refused_start(url, how)
            assert took < 2.5, "refused for good: at once"
            assert str(error) == f"cannot connect to NATS at {shown}: {REFUSED_ADVICE}"


def test_the_cli_says_what_to_change_for_refused_credentials(
    conf_server: Callable[[str], NatsServer], tmp_path: Path
) -> None:
    server = conf_server(f'authorization {{\n  user: admin\n  password: "{PASSWORD}"\n}}')
    for url, shown in _refused_urls(server):
        for args in COMMANDS:
            done, _ = refused_cli(url, args, tmp_path)
            said = f"anarchon: cannot connect to NATS at {shown}: {REFUSED_ADVICE}\n"
            assert done.stderr == said
            _no_secret(done.stdout, done.stderr)
