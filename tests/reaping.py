"""Signalling processes a test knows only by a pid it read (a file, /proc), never a Popen.

Such a pid may be gone and, on a busy machine whose pids wrap at 32 768, handed to another
process meanwhile: another test's server, or one of pytest's own workers (a CI run lost two
workers at once this way). So a pid is signalled only while it is still the process the test
saw: the same start time (``/proc/<pid>/stat`` field 22), or the same working directory.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot; None when there is no such pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: count from the last ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[19])


def working_directory(pid: int) -> Path | None:
    """The process's working directory; None when there is no such pid (or it is not ours)."""
    try:
        return Path(os.readlink(f"/proc/{pid}/cwd"))
    except OSError:
        return None


def is_same(pid: int, *, started: int | None = None, cwd: Path | None = None) -> bool:
    """Whether ``pid`` is still the process that started at ``started`` / runs in ``cwd``."""
    if started is not None and start_time(pid) != started:
        return False
    if cwd is not None and working_directory(pid) != cwd.resolve():
        return False
    return Path(f"/proc/{pid}").exists()


def kill_if_same(
    pid: int, *, started: int | None = None, cwd: Path | None = None, sig: int = signal.SIGKILL
) -> None:
    """Send ``sig`` to ``pid`` only while it is the same process (see :func:`is_same`)."""
    if started is None and cwd is None:
        raise ValueError("kill_if_same needs started= or cwd= to tell the process apart")
    if is_same(pid, started=started, cwd=cwd):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
