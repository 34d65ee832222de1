"""The runnable example of docs/backends/redis.md runs, on the shared server, in a fresh prefix."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from pathlib import Path

from tests.backends.redis import SERVER, delete_prefix, unique_prefix

DOC = Path(__file__).resolve().parents[2] / "docs" / "backends" / "redis.md"


async def test_the_example_runs() -> None:
    text = DOC.read_text()
    example = re.search(r"## Example\n.*?```python\n(.*?)```", text, re.S)
    assert example is not None, "no example in the Redis page"
    prefix = unique_prefix()
    code = example.group(1).replace('prefix="myapp:"', f'prefix="{prefix}"')
    assert prefix in code
    try:
        out = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        await delete_prefix(SERVER, prefix)
    assert out.returncode == 0, out.stderr
    assert "attempt 1" in out.stdout and "RunStatus.SUCCEEDED" in out.stdout, out.stdout


def test_the_operations_list_names_every_command_the_scripts_send() -> None:
    """An ACL written from the page's "Commands used" must allow every command a script sends."""
    package = Path(__file__).resolve().parents[2] / "src" / "anarchon" / "backends" / "redis"
    sources = [*package.glob("*.lua"), *package.glob("*.py")]
    sent = {
        name.upper()
        for path in sources
        for name in re.findall(r"redis\.p?call\(\s*['\"]([A-Za-z]+)['\"]", path.read_text())
    }
    listed = re.search(r"inside the scripts\s+`([A-Z\s]+)`", DOC.read_text())
    assert listed is not None, "no list of the scripts' commands in the Redis page"
    assert sent, "no redis.call found: the pattern no longer matches the scripts"
    assert sent <= set(listed.group(1).split()), sorted(sent - set(listed.group(1).split()))
