"""The documentation speaks of the product as it is: no numbers of our issue tracker, and the
commands and calls the migration guides name exist."""

from __future__ import annotations

import inspect
import re
import shlex
from pathlib import Path

import pytest

from anarchon import Scheduler
from tests.docs.blocks import ROOT

PAGES = sorted(
    [
        ROOT / "README.md",
        ROOT / "CHANGELOG.md",
        ROOT / "Makefile",
        *(ROOT / "docs").rglob("*.md"),
        *(ROOT / "bench").glob("*.md"),  # results.md is written by bench/report.py
        ROOT / "bench" / "report.py",
    ]
)
TRACKER = re.compile(r"\bissues? *#?\d+|\(#\d+\)", re.I)
GUIDES = [*sorted((ROOT / "docs" / "migrate").glob("*.md")), ROOT / "docs/guides/django.md"]


def test_no_page_names_an_issue_of_the_tracker() -> None:
    # "a pause for every instance comes with issue 13": readers have no such tracker, and the
    # feature had come. A page says what the product does.
    found = [
        f"{page.relative_to(ROOT)}:{number}: {line.strip()}"
        for page in PAGES
        for number, line in enumerate(page.read_text().splitlines(), 1)
        if TRACKER.search(line)
    ]
    assert not found, "\n".join(found)


def code_spans(page: Path) -> list[str]:
    text = page.read_text()
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)  # fenced blocks: tested elsewhere
    return re.findall(r"`([^`\n]+)`", text)


@pytest.mark.parametrize("page", GUIDES, ids=lambda p: p.name)
def test_the_guides_commands_and_calls_exist(page: Path) -> None:
    from anarchon.cli import _parser

    spans = code_spans(page)
    commands = [s for s in spans if re.match(r"anarchon [a-z]", s)]
    for command in commands:
        args = shlex.split(command.replace("NAME", "job").replace("JOB", "job"))[1:]
        names = next(a for a in _parser()._actions if a.dest == "command").choices
        assert names is not None and args[0] in names, f"{page.name}: `{command}`"
        if len(args) == 1:
            continue  # the command named in a sentence (`anarchon run`)
        try:
            _parser().parse_args(args)
        except SystemExit:
            pytest.fail(f"{page.name}: `{command}` is not a command line anarchon takes")
    calls = {m for s in spans for m in re.findall(r"\bscheduler\.(\w+)\(", s)}
    missing = sorted(name for name in calls if not callable(getattr(Scheduler, name, None)))
    assert not missing, f"{page.name}: Scheduler has no {missing}"
    assert commands or calls or page.name == "celery-beat.md"


def test_the_readme_explains_a_slot_of_the_quick_starts_sync() -> None:
    # `anarchon explain sync 2026-01-15T10:33:00Z` answered "not a slot of this schedule": sync
    # runs every five minutes.
    from datetime import datetime

    from anarchon import CronSchedule

    readme = (ROOT / "README.md").read_text()
    job = re.search(r'@scheduler\.job\("sync", "([^"]+)", timezone="([^"]+)"\)', readme)
    slot = re.search(r"^anarchon explain sync (\S+)", readme, re.M)
    assert job and slot
    at_ms = int(datetime.fromisoformat(slot.group(1)).timestamp() * 1000)
    schedule = CronSchedule(job.group(1), job.group(2))
    assert schedule.slots(at_ms - 1, at_ms) == [at_ms], slot.group(1)


def test_the_newest_tested_versions_are_those_installed() -> None:
    # docs/backends/redis.md said "tested with redis-py 8.1" while the suite ran on 8.2.0: the
    # one table of versions (docs/index.md) is checked against what the suite runs on.
    from importlib.metadata import version

    page = (ROOT / "docs" / "index.md").read_text()
    rows = re.findall(
        r"^\| [^|]+ \| ([\w-]+)(?: \(with \w+\))?(?:, ([\w-]+))? \| [^|]+ \| ([^|]+) \|$",
        page,
        re.M,
    )
    rows = [row for row in rows if row[0] != "package"]  # the header
    assert len(rows) == 4, rows
    for first, second, newest in rows:
        shown = [v.strip() for v in newest.split(",")]
        for package, tested in zip([first, second], shown * 2, strict=False):
            if package:
                installed = version(package)
                assert installed == tested or installed.startswith(tested + "."), (
                    f"docs/index.md: {package} {tested} is the newest tested; the suite runs on "
                    f"{installed}"
                )


def test_the_readme_names_every_field_of_metrics() -> None:
    # The README listed Metrics' fields as if complete and left out twelve (claims_backup,
    # slots_missed, instances_seen...).
    from anarchon import Metrics

    readme = (ROOT / "README.md").read_text()
    part = readme[readme.index("`scheduler.metrics()` returns") :]
    part = part[: part.index("\n## ")]
    fields = [*inspect.signature(Metrics).parameters, *Metrics.__slots__]  # counters, the rest
    missing = sorted({name for name in fields if f"`{name}`" not in part})
    assert not missing, f"the README's Metrics paragraph lacks {missing}"


def test_the_long_description_links_absolutely() -> None:
    # The README is PyPI's long description: its relative links (docs/guides/fastapi.md) and
    # the dashboard's screenshot broke there. setup.py makes them absolute for the build.
    import runpy
    import tomllib

    built = runpy.run_path(str(ROOT / "setup.py"), run_name="setup")
    text = built["long_description"]()
    urls = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]
    docs, repository = urls["Documentation"].rstrip("/"), urls["Repository"].rstrip("/")
    raw = repository.replace("https://github.com/", "https://raw.githubusercontent.com/")
    readme = (ROOT / "README.md").read_text()
    slugs = {
        re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")
        for title in re.findall(r"^#+ (.+)$", readme, re.M)
    }
    targets = re.findall(r"!?\[[^\]]*\]\(([^)\s]+)\)", text)
    assert len(targets) == len(re.findall(r"!?\[[^\]]*\]\(([^)\s]+)\)", readme)) > 30
    for target in targets:
        url, _, anchor = target.partition("#")
        if url.startswith(docs + "/"):
            page = url.removeprefix(docs + "/").rstrip("/") or "index"
            assert (ROOT / "docs" / f"{page}.md").exists() or (
                ROOT / "docs" / page / "index.md"
            ).exists(), target
        elif url.startswith(f"{repository}/blob/main/"):
            assert (ROOT / url.removeprefix(f"{repository}/blob/main/")).exists(), target
        elif url.startswith(f"{raw}/main/"):
            assert (ROOT / url.removeprefix(f"{raw}/main/")).exists(), target
        elif url == repository:
            assert anchor in slugs, target
        else:
            assert url.startswith("https://"), target
    assert "](docs/" not in text and "](#" not in text
    assert f"![The dashboard's jobs page]({raw}/main/docs/img/dashboard-jobs.png)" in text
