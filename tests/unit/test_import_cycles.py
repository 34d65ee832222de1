"""No anarchon module imports, at module level, one that imports it back (directly or through
others).

Every module under ``src/anarchon/`` is parsed (not imported, so no driver is needed). An import
in a function or under ``if TYPE_CHECKING:`` does not count: it runs after every module is
loaded, or never. A cycle loads only in one order (``anarchon.registry`` re-exported the views of
``anarchon._cluster``, which was built on registry's records, so the re-export had to come last in
registry), and which module a program imports first decides whether it loads at all.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from tests.unit.test_import_boundary import dotted_name, imported_from

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "anarchon"


def _module_name(path: Path) -> str:
    return dotted_name(path, PACKAGE, "anarchon")


def _module_level(tree: ast.Module) -> Iterator[ast.Import | ast.ImportFrom]:
    """The imports that run when the module is loaded (in ``try`` and plain ``if`` too)."""
    for statement in tree.body:
        if isinstance(statement, ast.If) and "TYPE_CHECKING" in ast.unparse(statement.test):
            continue
        nodes = ast.walk(statement) if isinstance(statement, ast.If | ast.Try) else [statement]
        yield from (n for n in nodes if isinstance(n, ast.Import | ast.ImportFrom))


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The anarchon modules ``path`` imports at module level, as absolute names."""
    module = _module_name(path)
    found: set[str] = set()
    for node in _module_level(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
            continue
        source = imported_from(node, path, module)
        for alias in node.names:  # `from . import errors` imports the module anarchon.errors
            name = f"{source}.{alias.name}"
            found.add(name if name in modules else source)
    return (found & modules) - {module}


def import_graph() -> dict[str, set[str]]:
    """Each anarchon module to the anarchon modules it imports at module level."""
    paths = {_module_name(path): path for path in PACKAGE.rglob("*.py")}
    return {name: _imports(path, set(paths)) for name, path in paths.items()}


def cycle_from(graph: dict[str, set[str]], start: str) -> list[str] | None:
    """A chain of imports from ``start`` back to itself, or None."""
    seen: set[str] = set()
    stack: list[tuple[str, list[str]]] = [(start, [start])]
    while stack:
        module, chain = stack.pop()
        for imported in sorted(graph[module]):
            if imported == start:
                return [*chain, start]
            if imported not in seen:
                seen.add(imported)
                stack.append((imported, [*chain, imported]))
    return None


def test_no_module_imports_one_that_imports_it_back() -> None:
    graph = import_graph()
    assert len(graph) > 100 and graph["anarchon.registry"]
    cycles = {" -> ".join(c) for m in sorted(graph) if (c := cycle_from(graph, m)) is not None}
    assert not cycles, "import cycles:\n" + "\n".join(sorted(cycles))


def test_the_graph_sees_relative_imports_and_leaves_type_checking_ones() -> None:
    graph = import_graph()
    assert "anarchon._records" in graph["anarchon.registry"]  # from ._records import ...
    assert "anarchon.errors" in graph["anarchon"]  # from . import _early, errors
    assert "anarchon.backend" not in graph["anarchon._cluster"]  # under TYPE_CHECKING
