"""Credentials in the server URL: percent-decoded, and refused when the backend is created if
they are incomplete or come with a second kind; ``.creds`` files checked for a usable JWT and
seed (QA probe creds.py: each of these started, or failed only at the server)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest

from anarchon import InvalidOption, backend_from_url
from anarchon.backends.nats import NatsBackend
from tests.nats.jwts import make_operator
from tests.nats.servers import NatsServer, unique_names
from tests.nats.test_access import (
    LOGGER,
    claims_once,
    conf_server,  # noqa: F401 (the fixture)
)
from tests.pki import make_pki

SECRET = "Zq7-secret"
RESERVED = "p@ss:w/rd%x?#&="


def _quote(text: str) -> str:
    from urllib.parse import quote

    return quote(text, safe="")


async def test_a_password_with_reserved_characters_is_percent_decoded(
    conf_server: Callable[[str], NatsServer],  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Before: ``nats://admin:p%40ss...@host`` sent ``p%40ss...`` and got Authorization
    Violation."""
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    server = conf_server(f'authorization {{\n  user: "ad:m@n"\n  password: "{RESERVED}"\n}}')
    stream, prefix = unique_names()
    url = f"nats://{_quote('ad:m@n')}:{_quote(RESERVED)}@127.0.0.1:{server.port}"
    backend = backend_from_url(f"{url}?stream={stream}&prefix={prefix}")
    assert isinstance(backend, NatsBackend)
    await claims_once(backend)
    await claims_once(NatsBackend(url, stream=stream, prefix=prefix))
    assert RESERVED not in repr(backend) and _quote(RESERVED) not in repr(backend)
    assert RESERVED not in caplog.text and _quote(RESERVED) not in caplog.text


async def test_a_token_with_reserved_characters_is_percent_decoded(
    conf_server: Callable[[str], NatsServer],  # noqa: F811
) -> None:
    server = conf_server(f'authorization {{\n  token: "{RESERVED}"\n}}')
    stream, prefix = unique_names()
    url = f"nats://{_quote(RESERVED)}@127.0.0.1:{server.port}?stream={stream}&prefix={prefix}"
    backend = backend_from_url(url)
    assert isinstance(backend, NatsBackend)
    await claims_once(backend)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A good .creds file, a CA certificate, a .creds file with a garbage JWT, one with a
    garbage seed."""
    root = tmp_path_factory.mktemp("creds")
    good = make_operator(root / "nsc").creds
    text = good.read_text()
    jwt_line = next(line for line in text.splitlines() if line.startswith("ey"))
    seed_line = next(line for line in text.splitlines() if line.startswith("SU"))
    bad_jwt = root / "bad-jwt.creds"
    bad_jwt.write_text(text.replace(jwt_line, "not.a.jwt" + SECRET))
    bad_seed = root / "bad-seed.creds"
    bad_seed.write_text(text.replace(seed_line, "SU" + SECRET))
    return {
        "good": good,
        "ca": make_pki(root / "pki").ca,
        "bad_jwt": bad_jwt,
        "bad_seed": bad_seed,
    }


HOST = "127.0.0.1:4222"


@pytest.mark.parametrize(
    ("url", "options", "text"),
    [
        (f"nats://{SECRET}@{HOST}", {"creds": "good"}, "server URL carries a token and creds="),
        (f"nats://admin:{SECRET}@{HOST}", {"token": SECRET}, "user and password and token="),
        (
            f"nats://{SECRET}@{HOST}",
            {"user": "admin", "password": SECRET},
            "carries a token and user=, password=",
        ),
        (f"nats://{HOST}", {"creds": "ca"}, r"creds='.*ca\.pem' holds no usable user JWT"),
        (f"nats://{HOST}", {"creds": "bad_jwt"}, "holds no usable user JWT"),
        (f"nats://{HOST}", {"creds": "bad_seed"}, "holds no usable user nkey seed"),
        (f"nats://admin:@{HOST}", {}, "user 'admin' has an empty password"),
        (f"nats://:{SECRET}@{HOST}", {}, "a password without a user name"),
        (f"nats://admin:a@{HOST}", {"server": f"nats://admin:b@{HOST}"}, "other credentials"),
    ],
)
def test_bad_url_credentials_are_refused_when_the_backend_is_created(
    files: dict[str, Path], url: str, options: dict[str, str], text: str
) -> None:
    kwargs = {k: str(files.get(v, v)) for k, v in options.items() if k != "server"}
    servers = [url, *([options["server"]] if "server" in options else [])]
    with pytest.raises(InvalidOption, match=text) as refused:
        NatsBackend(servers, **kwargs)  # type: ignore[arg-type]
    assert SECRET not in str(refused.value)
    if "server" not in options and not set(options) & {"user", "password", "token"}:
        query = "".join(f"&{k}={v}" for k, v in kwargs.items())
        with pytest.raises(InvalidOption, match=text) as refused:
            backend_from_url(f"{url}?stream=X{query}")
        assert SECRET not in str(refused.value)


def test_a_good_creds_file_and_url_credentials_alone_are_taken(files: dict[str, Path]) -> None:
    NatsBackend(f"nats://{HOST}", creds=str(files["good"]))
    NatsBackend(f"nats://admin:{SECRET}@{HOST}")
    NatsBackend(f"nats://{SECRET}@{HOST}")
    NatsBackend([f"nats://admin:{SECRET}@{HOST}", f"nats://admin:{SECRET}@127.0.0.1:4223"])
