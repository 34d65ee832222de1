"""CHANGELOG.md follows Keep a Changelog: an Unreleased section on top, released versions with
their dates below it, newest first, and changes only under the six kinds of change."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
KINDS = ("Added", "Changed", "Deprecated", "Removed", "Fixed", "Security")
RELEASE = re.compile(r"^\[(\d+\.\d+\.\d+)\] - (\d{4}-\d{2}-\d{2})$")


def test_the_changelog_keeps_its_format() -> None:
    import anarchon

    lines = (ROOT / "CHANGELOG.md").read_text().splitlines()
    assert lines[0] == "# Changelog"
    versions = [line[3:] for line in lines if line.startswith("## ")]
    assert versions[0] == "[Unreleased]", versions[:1]
    released = [RELEASE.match(v) for v in versions[1:]]
    assert all(released), [v for v, m in zip(versions[1:], released, strict=True) if not m]
    dates = [m.group(2) for m in released if m]
    assert dates == sorted(dates, reverse=True)
    assert anarchon.__version__ not in [m.group(1) for m in released if m][1:]
    section = kind = None
    for number, line in enumerate(lines, 1):
        if line.startswith("## "):
            section, kind = line, None
        elif line.startswith("### "):
            assert section is not None and line[4:] in KINDS, f"line {number}: {line!r}"
            kind = line
        elif line.startswith(("* ", "- ")):
            assert kind is not None, f"line {number}: a change outside Added/Changed/...: {line!r}"
