"""A database number the server does not have fails the start at once saying the rule, through
the API and the CLI, every option at its default. Before: ``DB index is out of range`` alone."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from anarchon import BackendError, BackendUnavailable, Scheduler, backend_from_url
from tests.backends.redis import SERVER, reachable

RULE = (
    "ResponseError: DB index is out of range (the database number, the URL's path, must be "
    "below the server's 'databases' setting, 16 unless changed)"
)


@pytest.fixture
async def url() -> str:
    """The shared server's URL with database 99 (the server has 16)."""
    if not await reachable(SERVER):
        pytest.skip(f"no Redis at {SERVER}")
    return f"redis://{urlsplit(SERVER).netloc}/99"


@pytest.mark.parametrize("how", ["start", "async with"])
async def test_a_database_number_out_of_range_names_the_rule(url: str, how: str) -> None:
    scheduler = Scheduler(backend_from_url(url))
    began = time.monotonic()
    with pytest.raises(BackendError) as failed:
        if how == "start":
            await scheduler.start()
        else:
            async with scheduler:
                pass
    assert time.monotonic() - began < 2.5, "refused for good: at once"
    assert not isinstance(failed.value, BackendUnavailable)
    assert str(failed.value) == f"cannot start the Redis backend: Redis {url}: {RULE}"


@pytest.mark.parametrize("args", [["jobs"], ["run", "app:scheduler"]])
def test_the_cli_names_the_rule(url: str, args: list[str], tmp_path: Path) -> None:
    (tmp_path / "app.py").write_text(
        "from anarchon import Scheduler\n"
        "scheduler = Scheduler()\n"
        "scheduler.add('tick', '* * * * *', lambda ctx: None)\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "anarchon", *args, "--backend", url],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 4, done.stderr
    assert done.stderr == f"anarchon: cannot start the Redis backend: Redis {url}: {RULE}\n"
