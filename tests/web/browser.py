"""Headless Chromium for the dashboard's browser tests and screenshots: Debian's ``chromium`` and
``chromium-driver``, installed by the test set-up when missing (never a downloaded browser), driven
by Selenium with the flags a closed network needs (shared/SERVICES.md)."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Final

from tests.debian import ensure_packages

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


def ensure_installed() -> str | None:
    """Install Debian's ``chromium`` and ``chromium-driver`` if missing (CI runs as root).

    Returns None when both are there, else why they could not be installed."""
    return ensure_packages(["chromium", "chromium-driver"], [CHROMIUM, DRIVER])


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
