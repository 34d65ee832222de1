"""What every measurement gets: settings, namespaces, the backend rows, a scratch folder."""

from __future__ import annotations

import json
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .fleet import poll, spawn
from .services import BACKENDS, Services, Target
from .settings import Settings

__all__ = ["Context"]


@dataclass
class Context:
    settings: Settings
    services: Services
    targets: dict[str, Target]
    work: Path
    peers_python: str | None
    began: float = field(default_factory=time.monotonic)

    def say(self, message: str) -> None:
        """A progress line on stderr (stdout gets the tables)."""
        print(
            f"[bench {time.monotonic() - self.began:6.1f}s] {message}", file=sys.stderr, flush=True
        )

    def available(self, lease: bool = False) -> list[Target]:
        return [t for t in self.targets.values() if t.available and (t.lease or not lease)]

    @staticmethod
    def index(name: str) -> int:
        """A backend's fixed position (0-3), used to stagger concurrent measurements."""
        return BACKENDS.index(name)

    def dir(self, section: str) -> Path:
        path = self.work / section
        path.mkdir(parents=True, exist_ok=True)
        return path

    async def probe(self, name: str, section: str, argv: list[str], limit_s: float) -> Any:
        """Run ``python -m bench.probe <argv>`` and return its JSON answer."""
        proc = spawn(name, ["bench.probe", *argv], self.dir(section), ready=False)
        if not await poll(lambda: not proc.alive(), limit_s):
            proc.send(signal.SIGKILL)
            raise RuntimeError(f"probe {name} took over {limit_s:.0f} s")
        if proc.popen.returncode != 0 or not proc.out.exists():
            raise RuntimeError(f"probe {name} failed: {proc.log_tail(3)}")
        return json.loads(proc.out.read_text())
