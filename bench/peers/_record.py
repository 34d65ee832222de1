"""Where every bench worker (anarchon's or a peer's) writes what happened, as JSON lines.

One file per process, opened with O_APPEND. Records are kept as given and written, as JSON,
in one ``write`` once they stop arriving (no new record for ``flush_ms``) or the oldest has
waited :data:`MAX_DEFER_S` (so 10 000 handler starts cost a few writes, not 10 000, and the
bench's own serialising runs after a burst of starts instead of inside the window it times),
or at once when ``flush_ms`` is 0 (the failover bench must see a start before it kills the
process). Standard library only: the peers' virtualenv has no anarchon.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

__all__ = ["MAX_DEFER_S", "Recorder", "write_json"]

#: The longest a record waits to be written while records keep arriving.
MAX_DEFER_S = 5.0


class Recorder:
    """Buffered JSON-lines writer for one process."""

    def __init__(self, path: str, flush_ms: int = 200) -> None:
        self.path = path
        self.flush_ms = flush_ms
        self._buffer: list[dict[str, Any]] = []

    def add(self, record: dict[str, Any]) -> None:
        """Queue ``record``, not to be changed after (written at once when ``flush_ms`` is 0)."""
        self._buffer.append(record)
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
        data = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in self._buffer).encode()
        self._buffer.clear()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)

    async def run(self) -> None:
        """Look every ``flush_ms`` until cancelled (then flush once more): flush when no record
        came since the last look, or when records have waited :data:`MAX_DEFER_S`."""
        period = max(self.flush_ms, 20) / 1000
        seen, waited = 0, 0.0
        try:
            while True:
                await asyncio.sleep(period)
                count = len(self._buffer)
                waited = waited + period if count else 0.0
                if count and (count == seen or waited >= MAX_DEFER_S):
                    self.flush()
                    count, waited = 0, 0.0
                seen = count
        finally:
            self.flush()


def write_json(path: str, data: dict[str, Any]) -> None:
    """Write ``data`` to ``path`` atomically (a reader never sees half a file)."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as handle:
        json.dump(data, handle)
    os.replace(tmp, path)
