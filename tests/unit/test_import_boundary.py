"""Backends import only the contract, the errors and the kit, never the core's private modules.

Every module under ``src/anarchon/backends/`` is parsed (not imported, so no driver is needed).
An import from anarchon must be ``anarchon.backend``, ``anarchon.errors``, ``anarchon.kit`` (or
a submodule), ``anarchon.registry`` (the registry store's records), ``anarchon.control``
(pauses and run requests) or the module's own backend package. :data:`ALLOWED` lists the
imports the backend packages still make of private modules: none since every backend moved onto
the kit; it may only shrink: an entry no longer needed fails the test until removed.
"""

from __future__ import annotations

import ast
from pathlib import Path

BACKENDS = Path(__file__).resolve().parents[2] / "src" / "anarchon" / "backends"
PUBLIC = (
    "anarchon.backend",
    "anarchon.control",
    "anarchon.errors",
    "anarchon.kit",
    "anarchon.registry",
)

# (module file relative to backends/, what it imports): to be emptied, never extended.
ALLOWED: set[tuple[str, str]] = set()


def dotted_name(path: Path, root: Path, prefix: str) -> str:
    """The module name of ``path``, a file under ``root``, which is the package ``prefix``."""
    parts = (*prefix.split("."), *path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_from(node: ast.ImportFrom, path: Path, module: str) -> str:
    """The absolute name ``from ... import`` names in ``module`` (the file ``path``)."""
    if not node.level:
        return node.module or ""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    base = package.split(".")[: len(package.split(".")) - node.level + 1]
    return ".".join([*base, *([node.module] if node.module else [])])


def _module_name(path: Path) -> str:
    return dotted_name(path, BACKENDS, "anarchon.backends")


def _own_package(path: Path) -> str:
    """A backend package's own name (``anarchon.backends.sqlite``); a lone module's own name."""
    relative = path.relative_to(BACKENDS)
    if len(relative.parts) > 1:
        return f"anarchon.backends.{relative.parts[0]}"
    return _module_name(path)


def _imports(path: Path) -> set[str]:
    """What a module imports from anarchon, as absolute names."""
    module = _module_name(path)
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "anarchon")
        elif isinstance(node, ast.ImportFrom):
            source = imported_from(node, path, module)
            if source.split(".")[0] != "anarchon":
                continue
            if source in ("anarchon", "anarchon.backends"):
                found.update(f"{source}.{a.name}" for a in node.names)
            else:
                found.add(source)
    return found


def _allowed(name: str, own: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in (*PUBLIC, own))


def _violations() -> set[tuple[str, str]]:
    out: set[tuple[str, str]] = set()
    for path in sorted(BACKENDS.rglob("*.py")):
        own = _own_package(path)
        for name in _imports(path):
            if not _allowed(name, own):
                out.add((path.relative_to(BACKENDS).as_posix(), name))
    return out


def test_backends_import_only_the_contract_the_errors_and_the_kit() -> None:
    new = _violations() - ALLOWED
    assert not new, (
        "backends may import only anarchon.backend, anarchon.errors, anarchon.kit and their own "
        f"package; these import private modules: {sorted(new)}"
    )


def test_the_allow_list_only_shrinks() -> None:
    stale = ALLOWED - _violations()
    assert not stale, f"these imports are gone: remove them from ALLOWED: {sorted(stale)}"


def test_the_checker_sees_a_private_import() -> None:
    assert _imports(BACKENDS / "memory.py") and all(
        _allowed(name, "anarchon.backends.memory") for name in _imports(BACKENDS / "memory.py")
    )
    assert not _allowed("anarchon._models", "anarchon.backends.memory")
    assert not _allowed("anarchon.backends._lease_rules", "anarchon.backends.memory")
    assert _allowed("anarchon.backends.sqlite._rows", "anarchon.backends.sqlite")
    assert not _allowed("anarchon.kitchen", "anarchon.backends.memory")
