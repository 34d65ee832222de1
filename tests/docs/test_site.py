"""The documentation site builds with ``mkdocs build --strict`` (a broken link, a page missing
from the nav, a docstring mkdocstrings cannot read: each fails), its API reference covers the
whole public surface, and every public name has a docstring to show there (mkdocstrings has no
option that fails on a missing one, so this test does)."""

from __future__ import annotations

import importlib
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = "\n".join(p.read_text() for p in (ROOT / "docs" / "reference").glob("*.md"))
PUBLIC_MODULES = (
    "anarchon",
    "anarchon.backend",
    "anarchon.errors",
    "anarchon.logs",
    "anarchon.registry",
    "anarchon.explain",
    "anarchon.testing",
    "anarchon.testing.contract",
    "anarchon.kit",
    "anarchon.kit.lease",
    "anarchon.kit.calls",
    "anarchon.kit.urls",
    "anarchon.kit.feed",
    "anarchon.kit.migrations",
    "anarchon.kit.sql",
    "anarchon.integrations.starlette",
    "anarchon.integrations.django",
)


@pytest.mark.slow
def test_the_site_builds_strictly(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert not re.search(r"^(WARNING|ERROR)", done.stderr, re.M), done.stderr
    page = (tmp_path / "reference" / "scheduler" / "index.html").read_text()
    assert 'id="anarchon.Scheduler.run_now"' in page  # the reference is rendered, not empty
    guide = (tmp_path / "guides" / "fastapi" / "index.html").read_text()
    assert "lifespan(scheduler, resources)" in guide  # the example file was included


def documented_modules() -> set[str]:
    return set(re.findall(r"^::: ([\w.]+)\s*$", REFERENCE, re.M))


def test_the_reference_shows_every_public_name() -> None:
    import anarchon

    shown = documented_modules()
    for module in PUBLIC_MODULES[1:]:
        assert module in shown, f"docs/reference has no '::: {module}'"
    for name in anarchon.__all__:
        if name == "__version__":
            continue
        home = getattr(anarchon, name).__module__
        assert f"anarchon.{name}" in shown or home in shown, (
            f"anarchon.{name} is not in the reference"
        )


def members(module: ModuleType) -> list[tuple[str, object]]:
    out: list[tuple[str, object]] = []
    for name in getattr(module, "__all__", []):
        obj = getattr(module, name)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            out.append((f"{module.__name__}.{name}", obj))
        if inspect.isclass(obj):
            for attr, member in vars(obj).items():
                if attr.startswith("_"):
                    continue
                if inspect.isfunction(member) or isinstance(member, property | classmethod):
                    out.append((f"{module.__name__}.{name}.{attr}", member))
    return out


@pytest.mark.parametrize("name", PUBLIC_MODULES)
def test_every_public_name_has_a_docstring(name: str) -> None:
    module = importlib.import_module(name)
    missing = [] if module.__doc__ else [name]
    for qualified, obj in members(module):
        target = obj.__func__ if isinstance(obj, classmethod) else obj
        if not inspect.getdoc(target):
            missing.append(qualified)
    assert not missing, f"no docstring: {', '.join(missing)}"
