"""One layout for every backend package (docs/writing-a-backend.md, "One layout for every
package"): the same files with the same roles, ``__init__.py`` only re-exporting the backend
class and naming, in its docstring, the claim method in ``_backend.py``, and ``_backend.py``
holding the contract's methods in :mod:`anarchon.backend`'s order, so a reader who has read one
backend knows where the next one's claim path is.

The modules are parsed, not imported (no driver is needed).
"""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import pytest

SOURCE = Path(__file__).resolve().parents[2] / "src" / "anarchon"
# Every backend package there is (a new one is checked without being named here).
PACKAGES = tuple(
    sorted(p.name for p in (SOURCE / "backends").iterdir() if (p / "__init__.py").is_file())
)
# The memory backend is one module: its class keeps the same order.
MEMORY = SOURCE / "backends" / "memory.py"
# The files every backend package has, each with one role (the storage text beside them has
# each backend's own form: queries.sql, *.lua, _subjects.py).
FILES = ("__init__.py", "_backend.py", "_connection.py", "_errors.py", "_options.py")


def _public_methods(node: ast.ClassDef) -> list[str]:
    return [
        item.name
        for item in node.body
        if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
        and not item.name.startswith("_")
    ]


def _classes(path: Path) -> dict[str, ast.ClassDef]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}


def contract_order(lease: bool) -> list[str]:
    """The contract's methods in ``backend.py``'s order: ``Backend``'s, then, for a lease backend,
    ``LeaseBackend``'s (a method it declares again, such as ``last_slots``, in its place)."""
    classes = _classes(SOURCE / "backend.py")
    order = _public_methods(classes["Backend"])
    if not lease:
        return order
    leases = _public_methods(classes["LeaseBackend"])
    return [name for name in order if name not in leases] + leases


def out_of_order(node: ast.ClassDef, lease: bool) -> list[str]:
    """The contract methods ``node`` defines, where they stand out of the contract's order (empty
    when in order): each name that comes after one the contract puts after it."""
    order = contract_order(lease)
    defined = [name for name in _public_methods(node) if name in order]
    return [
        f"{later} before {name}"
        for at, name in enumerate(defined)
        for later in defined[:at]
        if order.index(later) > order.index(name)
    ]


def interruptions(node: ast.ClassDef, lease: bool) -> list[str]:
    """The public methods of ``node`` that are not the contract's but stand among its contract
    methods (between the first and the last): a backend's own public methods come after the
    contract, so that it reads in one piece."""
    order = contract_order(lease)
    names = _public_methods(node)
    at = [n for n, name in enumerate(names) if name in order]
    return [name for name in names[at[0] : at[-1]] if name not in order] if at else []


def swapped(node: ast.ClassDef, lease: bool) -> list[ast.ClassDef]:
    """Copies of ``node``, each with one pair of neighbouring contract methods swapped."""
    order = contract_order(lease)
    at = [n for n, item in enumerate(node.body) if getattr(item, "name", None) in order]
    copies = []
    for first, second in itertools.pairwise(at):
        body = list(node.body)
        body[first], body[second] = body[second], body[first]
        copies.append(ast.ClassDef(node.name, node.bases, node.keywords, body, node.decorator_list))
    return copies


def _backend_class(package: str) -> ast.ClassDef:
    [node] = [
        node
        for name, node in _classes(SOURCE / "backends" / package / "_backend.py").items()
        if name.endswith("Backend")
    ]
    return node


def _is_lease(node: ast.ClassDef) -> bool:
    return any(ast.unparse(base).endswith("LeaseBackend") for base in node.bases)


def test_every_backend_package_is_checked() -> None:
    assert set(PACKAGES) >= {"sqlite", "postgres", "redis", "nats"}, PACKAGES


@pytest.mark.parametrize("package", PACKAGES)
def test_every_package_has_the_same_files(package: str) -> None:
    folder = SOURCE / "backends" / package
    assert [name for name in FILES if not (folder / name).is_file()] == []


@pytest.mark.parametrize("package", PACKAGES)
def test_init_only_re_exports_and_names_the_claim_path(package: str) -> None:
    path = SOURCE / "backends" / package / "__init__.py"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    doc = ast.get_docstring(tree) or ""
    backend = _backend_class(package)
    assert f"{backend.name}.claim" in doc and "_backend.py" in doc, "it names the claim path"
    assert "claim" in _public_methods(backend), "_backend.py holds the claim the docstring names"
    kinds = [type(node).__name__ for node in tree.body[1:]]
    assert set(kinds) <= {"ImportFrom", "Assign"}, kinds  # the imports and __all__ only
    [listed] = [n for n in tree.body if isinstance(n, ast.Assign)]
    assert [ast.unparse(t) for t in listed.targets] == ["__all__"]
    imported = [
        alias.asname or alias.name
        for n in tree.body
        if isinstance(n, ast.ImportFrom) and n.module != "__future__"
        for alias in n.names
    ]
    assert sorted(imported) == sorted(ast.literal_eval(listed.value)), "re-exports, each listed"


@pytest.mark.parametrize("package", PACKAGES)
def test_backend_py_holds_the_contract_methods_in_the_contract_order(package: str) -> None:
    node = _backend_class(package)
    assert out_of_order(node, _is_lease(node)) == []
    assert interruptions(node, _is_lease(node)) == []


@pytest.mark.parametrize("package", PACKAGES)
def test_backend_py_holds_the_backend_class_only(package: str) -> None:
    """Helpers, decoding and error tests live in the module of their role (``_rows.py``,
    ``_records.py``, ``_errors.py`` ...), not beside the contract; constants that tune one
    contract method may stay with it."""
    tree = ast.parse((SOURCE / "backends" / package / "_backend.py").read_text(encoding="utf-8"))
    defined = [
        node.name
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
    ]
    assert defined == [_backend_class(package).name]


def test_the_memory_backend_keeps_the_contract_order() -> None:
    node = _classes(MEMORY)["MemoryBackend"]
    assert out_of_order(node, lease=True) == []
    assert interruptions(node, lease=True) == []


@pytest.mark.parametrize("package", [*PACKAGES, "memory"])
def test_the_order_check_sees_any_two_neighbours_swapped(package: str) -> None:
    """On each backend's own class: every pair of neighbouring contract methods, swapped, is
    reported (the check reads this class, and its order is the contract's, not by chance)."""
    node = _classes(MEMORY)["MemoryBackend"] if package == "memory" else _backend_class(package)
    lease = package == "memory" or _is_lease(node)
    copies = swapped(node, lease)
    assert len(copies) >= 10
    assert all(out_of_order(copy, lease) for copy in copies)


def test_the_order_check_sees_a_method_out_of_place() -> None:
    source = (
        "class B(LeaseBackend):\n    async def renew(self): ...\n    async def claim(self): ...\n"
    )
    [node] = [n for n in ast.parse(source).body if isinstance(n, ast.ClassDef)]
    assert out_of_order(node, lease=True) == ["renew before claim"]
    assert out_of_order(node, lease=False) == []  # renew is no Backend method


def test_the_layout_check_sees_a_public_method_among_the_contract() -> None:
    source = (
        "class B(Backend):\n    async def claim(self): ...\n    def window_ms(self): ...\n"
        "    async def history(self): ...\n    def extra(self): ...\n"
    )
    [node] = [n for n in ast.parse(source).body if isinstance(n, ast.ClassDef)]
    assert interruptions(node, lease=False) == ["window_ms"]
