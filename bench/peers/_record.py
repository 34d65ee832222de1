"""Where every bench worker (anarchon's or a peer's) writes what happened, as JSON lines.

One file per process, opened with O_APPEND. Records are buffered and written every
``flush_ms`` in one ``write`` (so 10 000 handler starts cost a few writes, not 10 000), or at
once when ``flush_ms`` is 0 (the failover bench must see a start before it kills the process).
Standard library only: the peers' virtualenv has no anarchon.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

__all__ = ["Recorder", "write_json"]


class Recorder:
    """Buffered JSON-lines writer for one process."""

    def __init__(self, path: str, flush_ms: int = 200) -> None:
        self.path = path
        self.flush_ms = flush_ms
        self._buffer: list[str] = []

    def add(self, record: dict[str, Any]) -> None:
        """Queue ``record`` (written at once when ``flush_ms`` is 0)."""
        self._buffer.append(json.dumps(record, separators=(",", ":")))
        if self.flush_ms <= 0:
            self.flush()

    def start(self, job: str, slot_ms: int | None, **extra: Any) -> None:
        """Record a handler start now: job, slot (epoch ms), host time (epoch s), pid."""
        self.add(
            {"e": "start", "t": time.time(), "j": job, "s": slot_ms, "p": os.getpid(), **extra}
        )

    def flush(self) -> None:
        """Append everything queued in one write."""
        if not self._buffer:
            return
        data = ("\n".join(self._buffer) + "\n").encode()
        self._buffer.clear()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)

    async def run(self) -> None:
        """Flush every ``flush_ms`` until cancelled (then flush once more)."""
        try:
            while True:
                await asyncio.sleep(max(self.flush_ms, 20) / 1000)
                self.flush()
        finally:
            self.flush()


def write_json(path: str, data: dict[str, Any]) -> None:
    """Write ``data`` to ``path`` atomically (a reader never sees half a file)."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as handle:
        json.dump(data, handle)
    os.replace(tmp, path)
