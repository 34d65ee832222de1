"""``anarchon._early``: SIGINT and SIGTERM are caught from the package's first import in the
``anarchon`` command's process, and only there: an application that imports anarchon keeps its
signals as they are."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from anarchon._early import _module_run

ROOT = Path(__file__).resolve().parents[2]

SHOW = (
    "import signal, anarchon\n"
    "term = signal.getsignal(signal.SIGTERM)\n"
    "print(getattr(term, '__qualname__', repr(term)), "
    "signal.getsignal(signal.SIGINT) is signal.default_int_handler)\n"
)


@pytest.mark.parametrize(
    ("words", "module"),
    [
        (["-m", "anarchon", "run", "app:s"], "anarchon"),
        (["-manarchon", "run"], "anarchon"),
        (["-Im", "anarchon"], "anarchon"),
        (["-X", "dev", "-W", "error", "-m", "anarchon"], "anarchon"),
        (["-Xdev", "-m", "anarchon.cli"], "anarchon.cli"),
        (["-u", "-Bm", "pytest", "-m", "anarchon"], "pytest"),
        (["app.py", "-m", "anarchon"], None),
        (["-c", "import anarchon", "-m", "anarchon"], None),
        (["-m"], None),
        ([], None),
    ],
)
def test_the_module_python_runs_is_read_from_its_options(
    words: list[str], module: str | None
) -> None:
    assert _module_run(words) == module


def _signals(tmp_path: Path, *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", str(ROOT / "src"))}
    out = subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_an_application_that_imports_anarchon_keeps_its_signals(tmp_path: Path) -> None:
    (tmp_path / "app.py").write_text(SHOW)
    # A script named like the command, too: what counts is that it imports anarchon.cli.
    (tmp_path / "anarchon").write_text(SHOW)
    for args in (["app.py"], ["anarchon"], ["-c", SHOW]):
        assert _signals(tmp_path, *args) == "<Handlers.SIG_DFL: 0> True", args


def test_the_command_catches_them_from_the_packages_import(tmp_path: Path) -> None:
    show = SHOW.replace("import signal, anarchon", "import signal\nfrom anarchon.cli import main")
    (tmp_path / "script.py").write_text(show)  # as the console script imports it
    caught = _signals(tmp_path, "script.py")
    assert caught == "EarlySignals._caught False", caught
