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
from typing import Any

import pytest

from tests.public_modules import module_names

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = "\n".join(p.read_text() for p in (ROOT / "docs" / "reference").glob("*.md"))
# Every public module (no part of its path starts with _), found rather than listed, so a new one
# is checked too.
PUBLIC_MODULES = tuple(module_names())
# (module, why): a public module the API reference does not show.
NOT_IN_REFERENCE = {
    "anarchon.cli": "the `anarchon` command (its main() is the console script), documented as a "
    "command in README and docs/operations.md",
}


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site as `make docs` builds it (--strict), in a temporary directory."""
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert not re.search(r"^(WARNING|ERROR)", done.stderr, re.M), done.stderr
    return out


@pytest.mark.slow
def test_the_site_builds_strictly(site: Path) -> None:
    page = (site / "reference" / "scheduler" / "index.html").read_text()
    assert 'id="anarchon.Scheduler.run_now"' in page  # the reference is rendered, not empty
    guide = (site / "guides" / "fastapi" / "index.html").read_text()
    assert "lifespan(scheduler, resources)" in guide  # the example file was included


def test_make_docs_stays_strict() -> None:
    # mkdocs.yml says strict, and so does `make docs`: a warning (an unresolved cross-reference
    # made of a docstring's role among them) fails the build.
    assert re.search(r"^strict: true$", (ROOT / "mkdocs.yml").read_text(), re.M)
    recipe = (ROOT / "Makefile").read_text().split("\ndocs:", 1)[1].split("\n\n", 1)[0]
    assert "mkdocs build --strict" in recipe, recipe


RAW_ROLE = re.compile(r":(?:py:)?(?:class|meth|func|attr|data|mod|exc|obj|const):(?:<code>|`)")


@pytest.mark.slow
def test_no_sphinx_role_is_printed_raw(site: Path) -> None:
    # mkdocstrings reads a docstring's :param: fields but prints its inline roles as they are
    # (":class:<code>~anarchon.SQLiteBackend</code>"): docs/hooks/sphinx_roles.py makes them
    # cross-references. Code blocks (a docstring inside an example) keep theirs.
    raw: list[str] = []
    for page in sorted(site.rglob("*.html")):
        text = re.sub(r"<pre\b.*?</pre>", "", page.read_text(), flags=re.S)
        raw += [
            f"{page.relative_to(site)}: {text[m.start() : m.start() + 80]!r}"
            for m in RAW_ROLE.finditer(text)
        ]
    assert not raw, f"{len(raw)} raw roles:\n" + "\n".join(raw[:20])
    backends = (site / "reference" / "backends" / "index.html").read_text()
    # A role made a link: :class:`~anarchon.errors.BackendUnavailable` in the backends' docstrings.
    link = r'<a class="autorefs autorefs-internal"[^>]*href="../errors/#anarchon\.errors\.Backend'
    assert re.search(link + r'Unavailable"[^>]*><code>BackendUnavailable</code></a>', backends)


@pytest.fixture(scope="module")
def roles() -> Any:
    sys.path.insert(0, str(ROOT / "docs" / "hooks"))
    try:
        import sphinx_roles
    finally:
        sys.path.remove(str(ROOT / "docs" / "hooks"))
    return sphinx_roles


@pytest.fixture(scope="module")
def loaded(roles: Any) -> Any:
    import griffe

    loader = griffe.GriffeLoader(search_paths=[str(ROOT / "src")])
    loader.load("anarchon")
    loader.resolve_aliases(implicit=False, external=None)
    return loader.modules_collection


@pytest.mark.parametrize(
    ("where", "text", "expected"),
    [
        # ~ shows the last part; an export's public path is the link
        (
            "anarchon.Scheduler",
            ":class:`~anarchon.SQLiteBackend`",
            "[`SQLiteBackend`][anarchon.SQLiteBackend]",
        ),
        (
            "anarchon.Scheduler",
            ":class:`anarchon.SQLiteBackend`",
            "[`anarchon.SQLiteBackend`][anarchon.SQLiteBackend]",
        ),
        # a method's name from its class; an inherited member (Backend.history on LeaseBackend)
        ("anarchon.Scheduler.stop", ":meth:`start`", "[`start`][anarchon.Scheduler.start]"),
        (
            "anarchon.backend.LeaseBackend.open_runs",
            ":meth:`history`",
            "[`history`][anarchon.backend.Backend.history]",
        ),
        # an explicit title, a target broken over two lines, a name anarchon exports
        (
            "anarchon.health",
            ":meth:`Scheduler.health() <anarchon.Scheduler.health>`",
            "[`Scheduler.health()`][anarchon.Scheduler.health]",
        ),
        (
            "anarchon.control.ControlStore",
            ":meth:`~anarchon.backend.\n    Backend.claim`",
            "[`claim`][anarchon.backend.Backend.claim]",
        ),
        (
            "anarchon.errors",
            ":exc:`~anarchon.errors.BackendError`",
            "[`BackendError`][anarchon.errors.BackendError]",
        ),
        ("anarchon.errors", ":mod:`anarchon.backend`", "[`anarchon.backend`][anarchon.backend]"),
        # private: a link only when the site happens to show it; outside anarchon, ! : code
        (
            "anarchon.SQLiteBackend.subscribe",
            ":data:`~._options.EVENTS_POLL_MS`",
            '<autoref identifier="anarchon.backends.sqlite._options.EVENTS_POLL_MS" optional>'
            "<code>EVENTS_POLL_MS</code></autoref>",
        ),
        ("anarchon.errors", ":class:`ValueError`", "`ValueError`"),
        ("anarchon.errors", ":class:`!anarchon.Scheduler`", "`anarchon.Scheduler`"),
        ("anarchon.errors", "```\n:class:`X`\n```\n", "```\n:class:`X`\n```\n"),
    ],
)
def test_a_role_becomes_a_cross_reference(
    roles: Any, loaded: Any, where: str, text: str, expected: str
) -> None:
    obj = loaded[where]
    assert roles.convert(text, obj.final_target if obj.is_alias else obj, loaded) == expected


def documented_modules() -> set[str]:
    return set(re.findall(r"^::: ([\w.]+)\s*$", REFERENCE, re.M))


def public_module(name: str) -> ModuleType:
    """The module, or a skip when it needs an extra that is not installed."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        if (exc.name or "").partition(".")[0] == "anarchon":
            raise
        pytest.skip(f"{name} needs an extra that is not installed: {exc}")


@pytest.mark.parametrize("name", PUBLIC_MODULES[1:])
def test_the_reference_shows_every_public_module(name: str) -> None:
    # Its own '::: module', or each name of its __all__ shown on its own (the backends' packages:
    # '::: anarchon.SQLiteBackend', '::: anarchon.backends.sqlite.SQLiteControl').
    import anarchon

    shown = documented_modules()
    if name in NOT_IN_REFERENCE:
        assert name not in shown, f"{name} is in the reference: drop it from NOT_IN_REFERENCE"
        pytest.skip(NOT_IN_REFERENCE[name])
    if name in shown:
        return
    module = public_module(name)
    missing = [
        export
        for export in getattr(module, "__all__", [])
        if f"{name}.{export}" not in shown
        and not (
            f"anarchon.{export}" in shown
            and getattr(anarchon, export, None) is getattr(module, export)
        )
    ]
    assert not missing, f"docs/reference has no '::: {name}' nor {', '.join(missing)}"


def listed_members() -> dict[str, list[str]]:
    """Each ``::: module`` whose options list its members, to that list."""
    blocks = re.findall(r"^::: ([\w.]+)[ \t]*\n((?:(?:[ \t]+.*)?\n)*)", REFERENCE, re.M)
    out = {}
    for name, options in blocks:
        listed = re.search(r"^\s+members:[ \t]*\n((?:\s+- \w+[ \t]*\n)+)", options, re.M)
        if listed:
            out[name] = re.findall(r"- (\w+)", listed.group(1))
    return out


def test_a_module_that_lists_its_members_lists_its_all() -> None:
    # anarchon.registry lists its members (it defines none: its names are re-exports, which the
    # reference would otherwise show only if in __all__, in import order): a name added to its
    # __all__ and not to the list would be missing from the page.
    listed = listed_members()
    assert "anarchon.registry" in listed
    for name, members in listed.items():
        missing = sorted(set(getattr(importlib.import_module(name), "__all__", [])) - set(members))
        assert not missing, f"the reference's '::: {name}' does not list {', '.join(missing)}"


def test_the_reference_shows_every_public_name() -> None:
    import anarchon

    shown = documented_modules()
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
    module = public_module(name)
    missing = [] if module.__doc__ else [name]
    for qualified, obj in members(module):
        target = obj.__func__ if isinstance(obj, classmethod) else obj
        if not inspect.getdoc(target):
            missing.append(qualified)
    assert not missing, f"no docstring: {', '.join(missing)}"
