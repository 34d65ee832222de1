"""A database number the server does not have fails the start at once saying the rule, through
the API and the CLI, every option at its default. Before: ``DB index is out of range`` alone."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.backends.redis import SERVER, reachable
from tests.refusals import COMMANDS, HOW, refused_cli, refused_start

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


@pytest.mark.parametrize("how", HOW)
async def test_a_database_number_out_of_range_names_the_rule(url: str, how: str) -> None:
    error, took = await refused_start(url, how)
    assert took < 2.5, "refused for good: at once"
    assert str(error) == f"cannot start the Redis backend: Redis {url}: {RULE}"


@pytest.mark.parametrize("args", COMMANDS)
def test_the_cli_names_the_rule(url: str, args: tuple[str, ...], tmp_path: Path) -> None:
    done, _ = refused_cli(url, args, tmp_path)
    assert done.stderr == f"anarchon: cannot start the Redis backend: Redis {url}: {RULE}\n"
