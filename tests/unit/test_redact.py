"""Passwords and tokens never reach a message, a repr or a log line."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from anarchon import InvalidOption, NatsBackend, PostgresBackend, RedisBackend, backend_from_url
from tests.backends.postgres import drop_schema

ROOT = Path(__file__).resolve().parents[2]
SECRET = "S3cret"


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("postgresql://admin:S3cret@db/x", "postgresql://admin:***@db/x"),
        ("mysql://admin:S3cret@host/x", "mysql://admin:***@host/x"),
        ("redis://:S3cret@h:6379/0", "redis://:***@h:6379/0"),
        ("rediss://u:S3cret%40x@h", "rediss://u:***@h"),
        ("nats://admin:S3cret@host/?strem=X", "nats://admin:***@host/?strem=X"),
        ("nats://S3cret@h1:4222,h2:4222", "nats://***@h1:4222,h2:4222"),
        ("tls://S3cret@h", "tls://***@h"),
        ("postgresql://admin:pa/S3cret@host/db", "postgresql://admin:***@host/db"),
        (
            "postgresql://h/db?password=S3cret&sslmode=require",
            "postgresql://h/db?password=***&sslmode=require",
        ),
        ("nats://h:4222?token=S3cret", "nats://h:4222?token=***"),
        ("host=db password=S3cret user=x", "host=db password=*** user=x"),
        ("host=db password='S 3cret' user=x", "host=db password=*** user=x"),
        ("x?auth_token=S3cret&api_key=S3cret", "x?auth_token=***&api_key=***"),
        ("admin:S3cret@host", "admin:***@host"),
        ("in 'redis://u:S3cret@h/0': refused", "in 'redis://u:***@h/0': refused"),
        # Nothing secret: left as it is.
        ("redis://user@host:6379/0", "redis://user@host:6379/0"),
        ("postgresql://h:5432/db?application_name=x", "postgresql://h:5432/db?application_name=x"),
        ("sqlite:////tmp/a@b.db", "sqlite:////tmp/a@b.db"),
        ("postgresql://h/db?user=a@b.com", "postgresql://h/db?user=a@b.com"),
        ("at 12:30 the bypass=on", "at 12:30 the bypass=on"),
    ],
)
def test_redact_url(text: str, shown: str) -> None:
    from anarchon._redact import redact_url

    assert redact_url(text) == shown
    assert redact_url(shown) == shown


def test_the_formatter_masks_messages_and_tracebacks() -> None:
    from anarchon._redact import RedactingFormatter

    formatter = RedactingFormatter("%(message)s")
    try:
        raise ValueError("cannot reach postgresql://admin:S3cret@db/x")
    except ValueError:
        record = logging.LogRecord(
            "t", logging.ERROR, __file__, 1, "url %s", ("redis://:S3cret@h",), sys.exc_info()
        )
    out = formatter.format(record)
    assert "redis://:***@h" in out and "postgresql://admin:***@db/x" in out
    assert SECRET not in out


def test_reprs_and_url_errors_hide_the_password() -> None:
    backends = [
        RedisBackend("redis://admin:S3cret@127.0.0.1:6379/0"),
        PostgresBackend("postgresql://admin:S3cret@127.0.0.1/test"),
        NatsBackend("nats://admin:S3cret@127.0.0.1:4222"),
        NatsBackend("nats://S3cret@127.0.0.1:4222"),
    ]
    for backend in backends:
        assert SECRET not in repr(backend), repr(backend)
    for url in (
        "mysql://admin:S3cret@host/x",
        "nats://admin:S3cret@host/?strem=X",
        "nats://admin:S3cret@host/path",
        "redis://admin:S3cret@host:port/0",
        "redis://admin:S3cret@host/0?socket_timeout=abc",
        "postgresql://admin:S3cret@[::1/db",
        "admin:S3cret@host",
    ):
        with pytest.raises(InvalidOption) as info:
            backend_from_url(url)
        assert SECRET not in str(info.value) and "***" in str(info.value), str(info.value)
    with pytest.raises(InvalidOption) as info:
        NatsBackend(["nats://admin:S3cret@h", ""])
    assert SECRET not in str(info.value)


# One URL per scheme, each failing its own way: unknown scheme or option, refused connection,
# bad port, a real server that answers. None may print the password, on stdout, stderr or in
# a DEBUG log.
CASES = {
    "mysql-unknown-scheme": "mysql://admin:S3cret@127.0.0.1/x",
    "nats-unknown-option": "nats://admin:S3cret@127.0.0.1:4222/?strem=X",
    "nats-token-refused": "nats://S3cret@127.0.0.1:1",
    "tls-refused": "tls://admin:S3cret@127.0.0.1:1",
    "nats-real-server": "nats://admin:S3cret@127.0.0.1:4222?stream=ANARCHON_REDACT_T",
    "redis-refused": "redis://admin:S3cret@127.0.0.1:1/0",
    "rediss-bad-port": "rediss://admin:S3cret@127.0.0.1:port/0",
    "redis-real-server": "redis://:S3cret@127.0.0.1:6379/0?prefix=anarchon-redact-t:",
    "postgresql-refused": "postgresql://admin:S3cret@127.0.0.1:1/test?timeout_ms=300",
    "postgres-real-server": "postgres://postgres:S3cret@127.0.0.1:5432/test?schema=anarchon_redact_t",
    "postgresql-keyword-password": "postgresql://127.0.0.1:1/test?password=S3cret&timeout_ms=300",
    "sqlite-missing": "sqlite:////nonexistent/S3cret.db",
}


@pytest.mark.parametrize("how", ["--backend", "ANARCHON_BACKEND"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_the_cli_never_prints_a_password(case: str, how: str, tmp_path: Path) -> None:
    url = CASES[case]
    args = [sys.executable, "-m", "anarchon", "--log-level", "DEBUG", "history", "x"]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    if how == "--backend":
        args += ["--backend", url]
    else:
        env["ANARCHON_BACKEND"] = url
    out = subprocess.run(args, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    if case == "postgres-real-server":  # the read made its tables: remove them
        asyncio.run(drop_schema("anarchon_redact_t"))
    text = out.stdout + out.stderr
    if case == "sqlite-missing":  # a file name is no secret: it is shown
        assert out.returncode == 3 and "no anarchon data at /nonexistent/S3cret.db" in text
        return
    assert SECRET not in text, text
    assert "Traceback" not in text, text
    if "real-server" in case:
        # 3: nothing there (no stream, tables or records); 4: Redis refuses AUTH without a
        # password
        assert out.returncode in (0, 3, 4), text
    else:
        assert out.returncode in (2, 4), text
        assert out.stderr.strip().splitlines()[-1].startswith("anarchon: "), text
