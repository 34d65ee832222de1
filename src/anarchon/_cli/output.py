"""What the ``anarchon`` commands print for people: text from the backend shown safely, and
tables that fit in 100 columns.

Text a backend hands back (a handler's error, a skip reason, job and instance names from the
registry, ``requested_by``, who paused) may hold any character. Printed raw, a newline splits a
table row in two and an escape sequence is obeyed by the terminal (``ESC [ 31 m`` colours what
follows, ``ESC ] 0 ; … BEL`` sets the window's title). So every human format shows those
characters as visible escapes, the way Python writes them (``\\n``, ``\\t``, ``\\x1b``,
``\\u202e``): :func:`shown` for one value, :func:`table` for every cell, :func:`say` for each
text printed. ``--json`` prints the exact text: JSON escapes it.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from typing import Final, TextIO

from .._redact import redact_url

__all__ = ["WIDTH", "column_widths", "cut", "one_line", "say", "shown", "table"]

WIDTH: Final = 100
"""Every table line fits in this many columns."""
_GAP: Final = "  "
_OTHER_UNSAFE: Final = r"\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069"
"""Beside the C0 control characters: DEL and the C1 controls, the line and paragraph separators,
and the marks and overrides that reorder text (bidirectional controls)."""
_ANY_UNSAFE: Final = re.compile(rf"[\x00-\x1f{_OTHER_UNSAFE}]")
_UNSAFE_BUT_NEWLINE: Final = re.compile(rf"[\x00-\x09\x0b-\x1f{_OTHER_UNSAFE}]")
_NAMED: Final = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(found: re.Match[str]) -> str:
    char = found.group()
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def shown(text: str) -> str:
    """``text`` on one line with nothing a terminal obeys: every control character (newline
    and tab too) written as a visible escape such as ``\\n`` or ``\\x1b``."""
    return _ANY_UNSAFE.sub(_escape, text)


def one_line(text: str) -> str:
    """An error's text as one line for stderr: its lines joined, a secret in a URL masked, and
    what a terminal would obey escaped (:func:`shown`)."""
    joined = " ".join(part.strip() for part in text.splitlines() if part.strip())
    return shown(redact_url(joined))


def say(text: str = "", *, file: TextIO | None = None) -> None:
    """Print ``text`` for a person (on stdout, or ``file``): its lines kept, every other control
    character written as a visible escape, so no text printed by a command drives the
    terminal."""
    print(_UNSAFE_BUT_NEWLINE.sub(_escape, text), file=sys.stdout if file is None else file)


def cut(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters, ``~`` marking the cut."""
    return text if len(text) <= width else text[: max(width - 1, 0)] + "~"


def column_widths(
    header: Sequence[str], rows: Sequence[Sequence[str]], floors: Sequence[int] | None
) -> list[int]:
    """The width :func:`table` gives each column: its widest cell (shown safely), narrowed as
    ``floors`` allow to fit :data:`WIDTH` (a cell wider than its column is cut)."""
    widths = [max(len(shown(r[i])) for r in [header, *rows]) for i in range(len(header))]
    return widths if floors is None else _fit(widths, floors)


def _fit(widths: list[int], floors: Sequence[int]) -> list[int]:
    """Narrow the columns until the line fits in :data:`WIDTH`: each step takes one character
    from the column furthest above its floor; none goes below its floor."""
    widths = list(widths)
    excess = sum(widths) + len(_GAP) * (len(widths) - 1) - WIDTH
    while excess > 0:
        over = [w - max(f, 1) for w, f in zip(widths, floors, strict=True)]
        widest = max(range(len(over)), key=over.__getitem__)
        if over[widest] <= 0:
            break  # the floors themselves pass WIDTH: they win
        widths[widest] -= 1
        excess -= 1
    return widths


def table(
    header: Sequence[str], rows: Sequence[Sequence[str]], floors: Sequence[int] | None
) -> list[str]:
    """The lines of a table: a row per item, columns padded to their widest cell, every cell
    shown safely (:func:`shown`). With ``floors``, a line that would pass :data:`WIDTH` columns
    has its cells cut (``~`` marks a cut), first in the columns furthest above their floor,
    none below it; without, nothing is cut."""
    widths = column_widths(header, rows, floors)
    whole = [[cut(shown(c), w) for c, w in zip(r, widths, strict=True)] for r in [header, *rows]]
    return [_GAP.join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in whole]
