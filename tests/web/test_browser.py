"""The dashboard in a real browser (Debian's chromium, Selenium) against three real instances on
SQLite and on PostgreSQL, served by the ``anarchon dashboard`` command (issue 15, item 4)."""

from __future__ import annotations

import asyncio
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from anarchon import Run, backend_from_url, steering
from anarchon.control import Pause
from anarchon.web._data import fate_of
from tests.backends.postgres import DSN, drop_schema, fresh_schema
from tests.web import browser as chromium
from tests.web.cluster import TOKEN, Cluster, cluster, seed_missed_sync, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
PASSWORD = "S3cretPw-never-shown"
BACKENDS = ["sqlite", "postgres"]


@pytest.fixture(scope="module")
def installed() -> None:
    problem = chromium.ensure_installed()
    if problem is not None:
        pytest.skip(problem)


@pytest.fixture(params=BACKENDS)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'cron.db'}"
        return
    schema = fresh_schema()
    # Trust auth ignores the password: it is there to be hidden from every page.
    parts = urllib.parse.urlsplit(DSN)
    netloc = f"root:{PASSWORD}@{parts.hostname}:{parts.port or 5432}"
    yield f"postgresql://{netloc}{parts.path}?schema={schema}"
    asyncio.run(drop_schema(schema))


async def _read(url: str, job: str, limit: int = 500) -> tuple[list[Run], list[Pause]]:
    backend = backend_from_url(url)
    await backend.start_reader()
    try:
        control = backend.control()
        pauses = [] if control is None else await control.pauses()
        return await backend.history(job, limit), pauses
    finally:
        await backend.stop()


def history(url: str, job: str, limit: int = 500) -> list[Run]:
    return asyncio.run(_read(url, job, limit))[0]


def pauses(url: str) -> list[Pause]:
    return asyncio.run(_read(url, "tick", 1))[1]


def post(base: str, path: str, data: dict[str, str], cookie: str = "") -> int:
    request = urllib.request.Request(
        base + path, data=urllib.parse.urlencode(data).encode(), method="POST"
    )
    if cookie:
        request.add_header("Cookie", cookie)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def strip_of(driver: Any, job: str) -> list[tuple[int, str]]:
    # One script reads the whole strip: the page refreshes its content every few seconds, so
    # elements found one call earlier may be gone.
    cells = driver.execute_script(
        "return Array.from(document.querySelectorAll(arguments[0]))"
        ".map(c => [Number(c.dataset.slot), c.dataset.fate]);",
        f'tr[data-job="{job}"] td.strip a.cell',
    )
    return [(int(slot), str(fate)) for slot, fate in cells]


def stable(action: Any) -> Any:
    """Run ``action()`` again when a refresh replaced the element it used (bounded)."""
    from selenium.common.exceptions import StaleElementReferenceException

    for _ in range(20):
        try:
            return action()
        except StaleElementReferenceException:
            time.sleep(0.1)
    return action()


def check_rows_against_history(driver: Any, url: str) -> None:
    """Every settled slot of every row's strip shows the fate history records for it."""
    page_now = int(driver.find_element("tag name", "body").get_attribute("data-now"))
    jobs = driver.execute_script(
        "return Array.from(document.querySelectorAll('tr.job')).map(r => r.dataset.job);"
    )
    assert set(jobs) == {"tick", "flaky", "minutely"}
    for job in ("tick", "flaky", "minutely"):
        shown = strip_of(driver, job)
        assert len(shown) == 50, (job, len(shown))
        runs = history(url, job)
        newest: dict[int, Run] = {}
        for run in runs:  # newest first: keep each slot's newest attempt
            if run.slot_ms is not None:
                newest.setdefault(run.slot_ms, run)
        settled = [(s, f) for s, f in shown if s < page_now - 3_000]
        for slot, fate in settled:
            expected = fate_of(newest[slot]) if slot in newest else "none"
            assert fate == expected, (job, slot, fate, expected)
        recorded = sum(1 for _, f in settled if f != "none")
        assert recorded >= {"tick": 3, "flaky": 1, "minutely": 0}[job], (job, settled)
    badge = stable(
        lambda: (
            driver.find_element("css selector", 'tr[data-job="flaky"] td[data-last] .badge').text
        )
    )
    assert badge == "failed", badge
    flaky = [f for _, f in strip_of(driver, "flaky") if f not in ("none", "unread")]
    assert flaky and set(flaky) <= {"failed", "running"}, flaky
    tick = [f for _, f in strip_of(driver, "tick") if f not in ("none", "unread")]
    assert "succeeded" in tick, tick


def sign_in(driver: Any, base: str) -> None:
    driver.get(base + "/login")
    driver.find_element("name", "name").send_keys("alice")
    driver.find_element("name", "token").send_keys(TOKEN)
    driver.find_element("css selector", "form.login button").click()
    wait_until(lambda: driver.find_elements("css selector", "[data-operator]"), "signed in", 10)


def click_action(driver: Any, job: str, action: str) -> None:
    stable(
        lambda: driver.find_element(
            "css selector", f'tr[data-job="{job}"] button[data-action="{action}"]'
        ).click()
    )
    wait_until(
        lambda: driver.find_elements("css selector", "p.flash"), f"{action} of {job} to answer", 10
    )


def test_dashboard_in_a_browser(installed: None, url: str, tmp_path: Path) -> None:
    minute = int(time.time() // 60) * 60_000
    missed_slot = minute - 10 * 60_000
    reason = "no instance carried the job from 10:00 to 10:15 (test)"
    with cluster(url, tmp_path) as found, chromium.browser() as driver:
        seed_missed_sync(url, "minutely", missed_slot, reason)
        wait_until(lambda: len(history(url, "flaky")) >= 2, "flaky to run twice")
        base = found.base

        # Read-only until signed in: no action buttons, and a POST is refused.
        driver.get(base + "/")
        wait_until(lambda: driver.find_elements("css selector", "tr.job"), "the jobs page", 10)
        assert not driver.find_elements("css selector", "button[data-action]")
        check_rows_against_history(driver, url)
        assert post(base, "/jobs/tick/pause", {}) == 403

        sign_in(driver, base)
        session = driver.get_cookie("anarchon_operator")
        assert session is not None
        cookie = f"anarchon_operator={session['value']}"
        # Signed in but without the page's CSRF token: refused too.
        assert post(base, "/jobs/tick/pause", {}, cookie) == 403
        assert not pauses(url)

        # Pause: within a second every instance stops claiming 'tick'.
        click_action(driver, "tick", "pause")
        [held] = [p for p in pauses(url) if p.job == "tick"]
        assert held.by == "alice@dashboard"
        time.sleep(4)
        after = [r for r in history(url, "tick") if (r.slot_ms or 0) > held.at_ms + 1_000]
        assert len(after) >= 2, after
        assert all(
            r.status.value == "skipped" and (r.reason or "").startswith("paused by alice@dashboard")
            for r in after
        ), [(r.slot_ms, r.status, r.reason, r.instance) for r in after]
        driver.get(base + "/")
        assert stable(
            lambda: driver.find_elements("css selector", 'tr[data-job="tick"] [data-paused]')
        )
        assert "paused" in {f for _, f in strip_of(driver, "tick")}

        # Resume: it runs again.
        click_action(driver, "tick", "resume")
        resumed_at = time.time()
        wait_until(
            lambda: any(
                r.status.value == "succeeded" and r.started_at.timestamp() > resumed_at
                for r in history(url, "tick", 20)
            ),
            "tick to run after resume",
            15,
        )

        # A missed slot's explanation opens from the job's timeline.
        driver.get(base + "/jobs/minutely?range=1h")
        stable(
            lambda: driver.find_element(
                "css selector", f'.timeline a.cell[data-fate="missed"][data-slot="{missed_slot}"]'
            ).click()
        )
        wait_until(
            lambda: driver.find_elements("css selector", '#explain .story[data-kind="missed"]'),
            "the missed slot's explanation",
            10,
        )
        text = stable(lambda: driver.find_element("css selector", "#explain .story").text)
        assert reason in text and "missed" in text, text

        # No page shows the backend URL's password.
        for path in ("/", "/instances", "/jobs/tick", "/jobs/flaky?range=1h", "/login"):
            driver.get(base + path)
            assert PASSWORD not in driver.page_source, path
        assert PASSWORD not in found.logs()


def test_trigger_click_runs_the_job(installed: None, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'cron.db'}"
    with cluster(url, tmp_path) as found, chromium.browser() as driver:
        sign_in(driver, found.base)
        driver.get(found.base + "/")
        click_action(driver, "minutely", "trigger")

        def manual() -> list[Run]:
            return [r for r in history(url, "minutely", 50) if r.trigger.value == "manual"]

        wait_until(manual, "the triggered run", 10)
        [run] = manual()
        assert run.requested_by == "alice@dashboard"
        driver.get(found.base + "/jobs/minutely")
        assert driver.find_elements("css selector", 'tr[data-trigger="manual"]')


async def _trigger(url: str, job: str) -> str:
    """Store a trigger of ``job`` (as ``anarchon trigger --force`` does); its id."""
    backend = backend_from_url(url)
    await backend.start_reader()
    try:
        return (await steering.trigger(backend, job, by="carol@ops")).id
    finally:
        await backend.stop()


async def _pending(url: str) -> list[str]:
    backend = backend_from_url(url)
    await backend.start_reader()
    try:
        return [r.id for r in await steering.pending_requests(backend)]
    finally:
        await backend.stop()


def test_cancel_click_cancels_a_pending_request(installed: None, tmp_path: Path) -> None:
    """A trigger of a job no instance carries waits on the requests page; Cancel removes it,
    says so, and leaves its key recorded skipped (cancelled by the operator)."""
    url = f"sqlite:///{tmp_path / 'cron.db'}"
    with cluster(url, tmp_path) as found, chromium.browser() as driver:
        request_id = asyncio.run(_trigger(url, "ghost"))
        kept = asyncio.run(_trigger(url, "ghost"))
        sign_in(driver, found.base)
        driver.get(found.base + "/requests")
        row = f'tr[data-request="{request_id}"]'
        assert driver.find_elements("css selector", f'tr[data-request="{kept}"]')
        stable(lambda: driver.find_element("css selector", f"{row} button[data-action]").click())
        wait_until(lambda: driver.find_elements("css selector", "p.flash"), "the cancel", 10)
        flash = driver.find_element("css selector", "p.flash").text
        assert f"cancelled the trigger request {request_id[:8]} of ghost" in flash, flash
        assert not driver.find_elements("css selector", row)
        assert driver.find_elements("css selector", f'tr[data-request="{kept}"]')
        assert asyncio.run(_pending(url)) == [kept]
        [record] = history(url, "ghost")
        assert record.run_id == request_id and record.reason == "cancelled by alice@dashboard"


def test_cluster_helper_stops_everything(tmp_path: Path) -> None:
    """The processes the browser tests start are all gone afterwards (stopped by pid)."""
    found = Cluster(f"sqlite:///{tmp_path / 'cron.db'}", tmp_path)
    try:
        found.spawn_workers(1)
    finally:
        found.stop()
    assert all(p.poll() is not None for p in found.procs.values())
