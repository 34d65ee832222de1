"""Wall-clock steps for one process with libfaketime, the monotonic clock left alone.

A faked process reads its offset from a file of its own on every call (``FAKETIME_NO_CACHE=1``),
so the harness steps that process's wall clock by rewriting the file (``+0``, ``-60``, ``+60``).
``time.monotonic()`` stays true (``FAKETIME_DONT_FAKE_MONOTONIC=1``), as it does when NTP or a VM
resume steps a real clock; ``sitecustomize`` in ``faketime_site`` works around libfaketime's
broken ``time.sleep`` on Python 3.11 (see there).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

from tests.debian import ensure_packages

# The build whose faked calls hold one mutex (Debian's `faketime -m`). The plain one,
# libfaketime.so.1, is not safe for threads under FAKETIME_NO_CACHE: every faked call re-reads
# the offset file, first writing the file's name into a static buffer with snprintf, which zeroes
# the first byte before it writes the name; a thread that opens the name meanwhile opens "",
# finds no file (nor ~/.faketimerc, /etc/faketimerc) and applies "+0": the real time, for that
# reading and until the next call re-reads. Two threads reading the clock at full speed got the
# real time once in 7 000 to 33 000 readings (never once ~/.faketimerc held the same offset, so
# the failed open is the cause; never with this build). Our workers read it from several
# threads (the event loop, SQLite's, the lease keeper's): after a +2 h step, one claim recorded
# a start 2 h before its slot (tests/sqlite/test_clock_steps.py, CI of 325b105).
LIBRARY: Final = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1")
SITE_DIR: Final = Path(__file__).resolve().parent / "faketime_site"


def ensure_installed() -> str | None:
    """Install Debian's ``faketime`` package if the library is missing (CI runs as root).

    Returns None when the library is there, else why it could not be installed.
    """
    return ensure_packages(["faketime"], [LIBRARY], timeout_s=600)


class FakeClockFile:
    """The offset file of one faked process."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset_s = 0
        self.set(0)

    def set(self, offset_s: int) -> None:
        """Step the process's wall clock to ``offset_s`` seconds from the real one."""
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(f"{offset_s:+d}\n")
        tmp.replace(self.path)  # atomic: the library never reads half a file
        self.offset_s = offset_s

    def env(self) -> dict[str, str]:
        """The environment that puts a Python process under this clock."""
        return {
            "LD_PRELOAD": str(LIBRARY),
            "FAKETIME_TIMESTAMP_FILE": str(self.path),
            "FAKETIME_NO_CACHE": "1",
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
            "PYTHONPATH": os.pathsep.join(
                filter(None, (str(SITE_DIR), os.environ.get("PYTHONPATH")))
            ),
        }
