"""The docs' examples run: README's doctests and every script in docs/examples."""

from __future__ import annotations

import doctest
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_readme_doctests() -> None:
    failures, tried = doctest.testfile(str(ROOT / "README.md"), module_relative=False)
    assert tried > 0 and failures == 0


@pytest.mark.parametrize("doc", sorted((ROOT / "docs").rglob("*.md")), ids=lambda p: p.name)
def test_doc_doctests(doc: Path) -> None:
    failures, _ = doctest.testfile(str(doc), module_relative=False)
    assert failures == 0


def test_quickstart_runs() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "docs/examples/quickstart.py")],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    lines = out.stdout.splitlines()
    assert sum(line.startswith("tick for slot") for line in lines) >= 2
    assert "report: succeeded as manual" in lines
    assert lines[-1].startswith("tick history:") and lines[-1].count("succeeded") >= 2
