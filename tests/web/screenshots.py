"""``make screenshots``: the dashboard's pages as PNGs for the docs and the README.

    python -m tests.web.screenshots docs/img

Three real instances on a SQLite file in a temporary folder, a missed slot recorded, a job
paused from the dashboard, then headless Chromium photographs each page. About 30 s.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from tests.web import browser as chromium
from tests.web.cluster import TOKEN, cluster, seed_missed_sync, wait_until


def main(out: Path) -> None:
    problem = chromium.ensure_installed()
    if problem is not None:
        raise SystemExit(f"screenshots: {problem}")
    out.mkdir(parents=True, exist_ok=True)
    minute = int(time.time() // 60) * 60_000
    missed = minute - 12 * 60_000
    with tempfile.TemporaryDirectory(prefix="anarchon-shots-") as folder:
        tmp = Path(folder)
        url = f"sqlite:///{tmp / 'cron.db'}"
        with cluster(url, tmp) as found, chromium.browser(1400, 860) as driver:
            seed_missed_sync(
                url,
                "minutely",
                missed,
                "no instance carried the job from "
                f"{time.strftime('%H:%M', time.gmtime(missed / 1000 - 60))} to "
                f"{time.strftime('%H:%M', time.gmtime(missed / 1000 + 120))} UTC",
            )
            base = found.base
            driver.get(base + "/login")
            driver.find_element("name", "name").send_keys("alice")
            driver.find_element("name", "token").send_keys(TOKEN)
            driver.find_element("css selector", "form.login button").click()
            wait_until(lambda: driver.find_elements("css selector", "[data-operator]"), "sign-in")
            time.sleep(12)  # a dozen slots of 'tick', a few of 'flaky'
            driver.find_element(
                "css selector", 'tr[data-job="minutely"] button[data-action="pause"]'
            ).click()
            time.sleep(1)
            driver.get(base + "/")
            driver.save_screenshot(str(out / "dashboard-jobs.png"))
            driver.get(base + "/jobs/flaky?range=1h")
            driver.save_screenshot(str(out / "dashboard-job.png"))
            driver.get(base + "/jobs/minutely?range=1h")
            driver.find_element("css selector", f'a.cell[data-slot="{missed}"]').click()
            wait_until(
                lambda: driver.find_elements("css selector", "#explain .story"), "explanation"
            )
            driver.save_screenshot(str(out / "dashboard-slot.png"))
            driver.get(base + "/instances")
            driver.save_screenshot(str(out / "dashboard-instances.png"))
    for name in ("jobs", "job", "slot", "instances"):
        print(out / f"dashboard-{name}.png")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/img"))
