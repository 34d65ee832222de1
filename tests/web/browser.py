"""Headless Chromium for the dashboard's browser tests and screenshots: Debian's ``chromium`` and
``chromium-driver``, installed by the test set-up when missing (never a downloaded browser), driven
by Selenium with the flags a closed network needs (shared/SERVICES.md)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from selenium.webdriver.remote.webdriver import WebDriver

CHROMIUM: Final = Path("/usr/bin/chromium")
DRIVER: Final = Path("/usr/bin/chromedriver")
FLAGS: Final = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
)
_install_lock = threading.Lock()


def ensure_installed() -> str | None:
    """Install Debian's ``chromium`` and ``chromium-driver`` if missing (CI runs as root).

    Returns None when both are there, else why they could not be installed."""
    with _install_lock:
        if CHROMIUM.exists() and DRIVER.exists():
            return None
        if os.geteuid() != 0 or shutil.which("apt-get") is None:
            return "chromium is missing and apt-get cannot install it here (not root)"
        for command in (
            ["apt-get", "update", "-qq"],
            ["apt-get", "install", "-y", "-qq", "chromium", "chromium-driver"],
        ):
            done = subprocess.run(
                command,
                capture_output=True,
                text=True,
                timeout=900,
                env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
            )
            if done.returncode != 0:
                return f"{' '.join(command)} failed: {done.stderr.strip()[-500:]}"
        if CHROMIUM.exists() and DRIVER.exists():
            return None
        return "installed chromium and chromium-driver but a binary is missing"


@contextmanager
def browser(width: int = 1400, height: int = 900) -> Iterator[WebDriver]:
    """A headless Chromium with a fresh profile, quit (and its driver stopped) afterwards."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    with tempfile.TemporaryDirectory(prefix="anarchon-chromium-") as profile:
        options = webdriver.ChromeOptions()
        options.binary_location = str(CHROMIUM)
        for flag in (*FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}"):
            options.add_argument(flag)
        driver = webdriver.Chrome(service=Service(str(DRIVER)), options=options)
        driver.set_page_load_timeout(30)
        driver.set_script_timeout(30)
        try:
            yield driver
        finally:
            driver.quit()
