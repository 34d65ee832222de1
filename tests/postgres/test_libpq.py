"""What the backend needs of psycopg and its libpq, and what ``anarchon[postgres]`` installs.

psycopg runs on the libpq of its binary package (17 since 3.2.3, what every test venv uses) or,
pure Python, on the system's (Debian 12: 15). A libpq without ``cancel_safe`` (before 17)
cancels a call past ``timeout_ms`` from a thread, without a time limit: the backend says so
once; one without pipeline mode (before 14) cannot send the backend's results: refused. A
psycopg that is installed but cannot load (no libpq) is named with psycopg's own reason."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import psycopg
import pytest
from psycopg import NotSupportedError

from anarchon import BackendError, PostgresBackend
from tests.backends.postgres import DSN, url_of

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(120)


def _python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, **env},
        timeout=90,
        check=False,
    )


def test_an_installed_psycopg_that_cannot_load_is_named_with_its_reason() -> None:
    """It said "pip install 'anarchon[postgres]'" though psycopg was installed."""
    out = _python(
        "from anarchon import PostgresBackend\nPostgresBackend('postgresql://db/app')",
        PSYCOPG_IMPL="c",  # an implementation that is not installed: psycopg cannot load
    )
    assert out.returncode == 1
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "anarchon.errors.MissingDependency: PostgresBackend cannot import psycopg, which is "
        "installed: couldn't import requested psycopg 'c' implementation: No module named "
        "'psycopg_c'"
    ), out.stderr


START_TWICE = """
import asyncio, logging, sys
from anarchon import PostgresBackend
logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s %(action)s %(message)s")
async def main():
    for _ in range(2):
        backend = PostgresBackend.from_url(sys.argv[1])
        await backend.start()
        await backend.stop()
asyncio.run(main())
"""


def test_a_libpq_before_17_is_named_once_at_start(schema: str) -> None:
    """psycopg's pure-Python implementation on the system's libpq (15 here), options at their
    defaults: one WARNING in two starts, with psycopg's own words. It said nothing."""
    command = [sys.executable, "-c", START_TWICE, url_of(schema)]
    env = {**os.environ, "PSYCOPG_IMPL": "python"}
    out = subprocess.run(command, capture_output=True, text=True, env=env, timeout=90, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(
        "WARNING anarchon.backends.postgres libpq_old the feature 'Connection.cancel_safe()' "
        "is not available: the client libpq version (imported from system libraries) is "
    ), lines
    assert "a call past timeout_ms is cancelled from a thread, without a time limit" in lines[0]
    # The binary package's libpq (this venv's) is 17 or newer: nothing said.
    same = subprocess.run(command, capture_output=True, text=True, timeout=90, cwd=ROOT)
    assert psycopg.pq.__impl__ == "binary" and psycopg.pq.version() >= 170000
    assert same.returncode == 0 and same.stderr == "", same.stderr


async def test_a_libpq_without_pipeline_mode_is_refused(
    schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def has_pipeline(check: bool = False) -> bool:
        raise NotSupportedError("the feature 'pipeline mode' is not available: libpq is 13.0")

    monkeypatch.setattr(psycopg.capabilities, "has_pipeline", has_pipeline)
    backend = PostgresBackend(DSN, schema=schema)
    with pytest.raises(BackendError) as caught:
        await backend.start()
    assert str(caught.value).startswith(
        "the PostgreSQL backend needs libpq 14 or newer: the feature 'pipeline mode' is not "
        "available: libpq is 13.0; install 'anarchon[postgres]'"
    )


def test_the_postgres_extra_installs_the_binary_package_every_test_runs_on() -> None:
    """The extra matches the test venvs (psycopg[binary], libpq 17): it installed psycopg
    pure-Python on the system's libpq, which no test ran on."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extra = project["optional-dependencies"]["postgres"]
    assert "psycopg[binary]>=3.2.3,<4" in extra and "psycopg-pool>=3.2,<4" in extra, extra
    assert any(d.startswith("psycopg[binary]") for d in project["optional-dependencies"]["test"])
