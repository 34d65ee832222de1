"""The package as a user gets it: ``python -m build`` makes a wheel and an sdist without a
warning, ``twine check`` passes, the wheel installs into a fresh virtual environment of every
Python here (3.11 to 3.13, those that exist) and ``anarchon demo`` runs from it, and its type
hints reach a user's ``mypy --strict``."""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
SKIP = shutil.ignore_patterns(
    ".git", ".venv", "*.egg-info", "build", "dist", "site", "__pycache__", ".*_cache", "bench"
)
# Interpreters to install into: this one, and pyenv's 3.12 and 3.13 where the machine has them.
PYTHONS = {
    "3.11": sys.executable,
    **{
        version: found[-1]
        for version in ("3.12", "3.13")
        if (found := sorted(glob.glob(f"/root/.pyenv/versions/{version}.*/bin/python3")))
    },
}

USER_PROGRAM = """
from __future__ import annotations

from anarchon import Run, RunContext, RunStatus, Scheduler, SQLiteBackend
from anarchon.integrations.starlette import lifespan
from anarchon.testing import FakeClock, MemoryBackend

scheduler = Scheduler(SQLiteBackend("app.db"), grace_ms=5_000)


@scheduler.job("report", "0 6 * * MON-FRI", timezone="Europe/Athens")
async def report(ctx: RunContext) -> None:
    fence: int | None = ctx.fence
    ctx.logger.info("fence %s", fence)


async def last_status() -> RunStatus | None:
    run: Run | None = await scheduler.last_run("report")
    return run.status if run else None


clock = FakeClock()
in_tests = Scheduler(MemoryBackend(clock=clock), clock=clock)
app_lifespan = lifespan(scheduler)
"""
WRONG_PROGRAM = """
from __future__ import annotations

from anarchon import RunContext, Scheduler

scheduler = Scheduler()


def handler(ctx: RunContext) -> None: ...


scheduler.add("report", 6, handler)
grace: str = scheduler.grace_ms
"""


def run(args: list[str | Path], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    done = subprocess.run(
        [str(a) for a in args],
        cwd=cwd,
        env={**environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"{args}:\n{done.stdout}\n{done.stderr}"
    return done


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel and sdist, built from a copy of the source tree (the tree itself untouched)."""
    tmp = tmp_path_factory.mktemp("build")
    source = tmp / "source"
    shutil.copytree(ROOT, source, ignore=SKIP)
    out = tmp / "dist"
    built = run([sys.executable, "-m", "build", "--outdir", out, source], tmp)
    text = built.stdout + built.stderr
    assert not re.search(r"(?i)warn", text), text
    return out


def test_build_makes_a_wheel_and_an_sdist_that_twine_accepts(dist: Path) -> None:
    names = sorted(p.name for p in dist.iterdir())
    assert names == ["anarchon-0.1.0-py3-none-any.whl", "anarchon-0.1.0.tar.gz"], names
    checked = run([BIN / "twine", "check", "--strict", *sorted(dist.iterdir())], dist)
    assert checked.stdout.count("PASSED") == 2, checked.stdout
    import zipfile

    with zipfile.ZipFile(dist / "anarchon-0.1.0-py3-none-any.whl") as wheel:
        files = set(wheel.namelist())
        metadata = wheel.read("anarchon-0.1.0.dist-info/METADATA").decode()
    for shipped in (
        "anarchon/py.typed",
        "anarchon/backends/sqlite/queries.sql",
        "anarchon/backends/redis/claim.lua",
        "anarchon/integrations/django/management/commands/anarchon.py",
        "anarchon-0.1.0.dist-info/licenses/LICENSE",
    ):
        assert shipped in files, shipped
    assert "License-Expression: MIT" in metadata
    assert "Classifier: Programming Language :: Python :: 3.13" in metadata
    assert re.search(r"^Project-URL: Documentation, https://", metadata, re.M)
    # The README, PyPI's page, with absolute links (setup.py): relative ones lead nowhere there.
    assert "Description-Content-Type: text/markdown" in metadata
    assert "## Quick start" in metadata and "](docs/" not in metadata, metadata[:2000]
    image = "https://raw.githubusercontent.com/anarchon/anarchon/main/docs/img/dashboard-jobs.png"
    assert f"]({image})" in metadata


@pytest.mark.parametrize("version", sorted(PYTHONS))
def test_the_wheel_installs_in_a_fresh_venv_and_the_demo_runs(
    version: str, dist: Path, tmp_path: Path
) -> None:
    venv = tmp_path / "venv"
    run([PYTHONS[version], "-m", "venv", "--without-pip", venv], tmp_path)
    # This environment's pip installs into the new one (quicker than bootstrapping a pip there);
    # cronsim comes from the package index (or pip's cache).
    wheel = dist / "anarchon-0.1.0-py3-none-any.whl"
    run([BIN / "pip", "--python", venv / "bin/python", "install", "-q", wheel], tmp_path)
    shown = run([venv / "bin/python", "-c", "import sys, anarchon; print(sys.version)"], tmp_path)
    assert shown.stdout.startswith(version), shown.stdout
    demo = run([venv / "bin/anarchon", "demo", "--instances", "2", "--seconds", "4"], tmp_path)
    assert re.search(r"slots: [1-9]\d*, runs: \d+, duplicates: 0, missed: 0", demo.stdout), (
        demo.stdout
    )
    if version != "3.11":
        return
    # The types reach a user's mypy --strict through py.typed (PEP 561), from the installed
    # wheel, not from this source tree: a correct program passes, a wrong one is caught.
    (tmp_path / "user_app.py").write_text(USER_PROGRAM)
    (tmp_path / "wrong_app.py").write_text(WRONG_PROGRAM)
    mypy: list[str | Path] = [BIN / "mypy", "--strict", "--cache-dir", tmp_path / "cache"]
    mypy += ["--python-executable", venv / "bin/python"]
    checked = run([*mypy, "user_app.py"], tmp_path)
    assert "Success: no issues found in 1 source file" in checked.stdout, checked.stdout
    wrong = subprocess.run(
        [str(a) for a in [*mypy, "wrong_app.py"]],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert wrong.returncode == 1, wrong.stdout
    assert 'Argument 2 to "add" of "Scheduler" has incompatible type "int"' in wrong.stdout
    assert 'Incompatible types in assignment (expression has type "int"' in wrong.stdout
