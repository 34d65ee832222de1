"""Install the Debian packages a test needs (Chromium, Prometheus, libfaketime) when they are
missing: CI runs as root on a machine that may not have them yet."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from collections.abc import Sequence
from pathlib import Path

__all__ = ["ensure_packages"]

_install_lock = threading.Lock()


def ensure_packages(
    packages: Sequence[str], needed: Sequence[Path], timeout_s: float = 900
) -> str | None:
    """Install ``packages`` with apt-get unless every path in ``needed`` exists; None when they
    all exist afterwards, else why they could not be installed (for a skip message)."""
    names = " ".join(packages)
    with _install_lock:
        if all(path.exists() for path in needed):
            return None
        if os.geteuid() != 0 or shutil.which("apt-get") is None:
            missing = next(str(path) for path in needed if not path.exists())
            return f"{missing} is missing and apt-get cannot install '{names}' here (not root)"
        for command in (
            ["apt-get", "update", "-qq"],
            ["apt-get", "install", "-y", "-qq", *packages],
        ):
            done = subprocess.run(
                command,
                capture_output=True,
                text=True,
                timeout=timeout_s,
                env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
            )
            if done.returncode != 0:
                return f"{' '.join(command)} failed: {done.stderr.strip()[-500:]}"
        missing_after = [str(path) for path in needed if not path.exists()]
        if missing_after:
            return f"installed '{names}' but {', '.join(missing_after)} is missing"
        return None
