"""The code blocks of the documentation, with the marker that says how each is checked.

A fenced block in ``README.md`` or ``docs/`` is preceded (blank lines aside) by one of:

* ``<!-- not runnable: REASON -->``: shown, not run; the reason says why;
* ``<!-- test: tests/PATH.py NAME -->``: the test file runs it; it finds the block by ``NAME``
  (:func:`block`), so ``NAME`` must appear in it. Without ``NAME`` the test file must name the page.

or needs no marker because it is run anyway:

* a doctest (its first line starts with ``>>>``): ``tests/unit/test_docs.py`` runs every page
  through doctest;
* an included file (``--8<-- "file"``, MkDocs' snippets) under ``docs/examples``, whose name a
  test names: the tests run the file itself.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "docs" / "examples"
MARKER = re.compile(r"^\s*<!--\s*(not runnable|test):\s*(.*?)\s*-->\s*$")
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([^`\s]*)")
SNIPPET = re.compile(r'^\s*--8<--\s+"([^"]+)"\s*$')


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    lang: str
    code: str
    marker: str | None
    """``not runnable`` or ``test``; None without a marker."""
    argument: str

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    @property
    def is_doctest(self) -> bool:
        return self.code.lstrip().startswith(">>>")

    @property
    def snippets(self) -> list[str]:
        """The files a block made only of ``--8<--`` lines includes, else []."""
        lines = [line for line in self.code.splitlines() if line.strip()]
        found = [SNIPPET.match(line) for line in lines]
        return [m.group(1) for m in found if m] if lines and all(found) else []


def pages() -> list[Path]:
    """README.md and every Markdown page under docs/ (the examples folder aside)."""
    docs = [p for p in (ROOT / "docs").rglob("*.md") if EXAMPLES not in p.parents]
    return [ROOT / "README.md", *sorted(docs)]


def blocks(page: Path) -> list[Block]:
    found: list[Block] = []
    lines = page.read_text().splitlines()
    marker: tuple[str, str] | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        mark = MARKER.match(line)
        fence = FENCE.match(line)
        if mark:
            marker = (mark.group(1), mark.group(2))
        elif fence:
            indent, ticks, lang = fence.groups()
            end = i + 1
            while end < len(lines) and not re.match(
                rf"^\s*{re.escape(ticks[0])}{{{len(ticks)},}}\s*$", lines[end]
            ):
                end += 1
            body = "\n".join(x[len(indent) :] for x in lines[i + 1 : end])
            kind, argument = marker or (None, "")
            found.append(Block(page, i + 1, lang, body + "\n", kind, argument))
            marker = None
            i = end
        elif line.strip():
            marker = None
        i += 1
    return found


def block(page: str, name: str) -> str:
    """The code of the block of ``page`` (relative to the root) marked ``test: ... NAME``."""
    for candidate in blocks(ROOT / page):
        if candidate.marker == "test" and candidate.argument.split()[-1:] == [name]:
            return candidate.code
    raise AssertionError(f"no block marked {name!r} in {page}")
