"""The documentation's example runs, and the package imports without nats-py."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.nats.servers import SHARED_URL, delete_stream, unique_names

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "backends" / "nats.md"


def example() -> str:
    text = PAGE.read_text()
    section = text.split("## A runnable example", 1)[1]
    found = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert found is not None
    return found.group(1)


@pytest.mark.slow
def test_the_runnable_example_runs() -> None:
    stream, prefix = unique_names()
    code = example().replace("EXAMPLE_CRON", stream).replace("example.cron.", prefix)
    assert "nats://127.0.0.1:4222" in code
    try:
        done = subprocess.run(
            [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
        )
    finally:
        asyncio.run(delete_stream(SHARED_URL, stream))
    assert done.returncode == 0, done.stderr
    assert "manual run: succeeded" in done.stdout, done.stdout
    assert done.stdout.count("tick for ") >= 3, done.stdout
    assert "schedule" in done.stdout and "manual" in done.stdout


def test_the_module_imports_without_nats_py_and_says_what_to_install() -> None:
    code = (
        "import sys; sys.modules['nats'] = None\n"
        "from anarchon.backends.nats import NatsBackend\n"
        "from anarchon import MissingDependency\n"
        "try:\n"
        "    NatsBackend()\n"
        "except MissingDependency as exc:\n"
        "    print(exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "pip install 'anarchon[nats]'" in done.stdout
