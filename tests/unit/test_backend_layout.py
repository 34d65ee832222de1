"""One layout for every backend package (docs/writing-a-backend.md, "One layout for every
package"): the same files with the same roles, ``__init__.py`` only re-exporting the backend
class and naming, in its docstring, the claim method in ``_backend.py``, and ``_backend.py``
holding the contract's methods in :mod:`anarchon.backend`'s order, so a reader who has read one
backend knows where the next one's claim path is.

The modules are parsed, not imported (no driver is needed).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SOURCE = Path(__file__).resolve().parents[2] / "src" / "anarchon"
PACKAGES = ("sqlite", "postgres", "redis", "nats")
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


def _backend_class(package: str) -> ast.ClassDef:
    [node] = [
        node
        for name, node in _classes(SOURCE / "backends" / package / "_backend.py").items()
        if name.endswith("Backend")
    ]
    return node


def _is_lease(node: ast.ClassDef) -> bool:
    return any(ast.unparse(base).endswith("LeaseBackend") for base in node.bases)


@pytest.mark.parametrize("package", PACKAGES)
def test_every_package_has_the_same_files(package: str) -> None:
    folder = SOURCE / "backends" / package
    assert [name for name in FILES if not (folder / name).is_file()] == []


@pytest.mark.parametrize("package", PACKAGES)
def test_init_only_re_exports_and_names_the_claim_path(package: str) -> None:
    path = SOURCE / "backends" / package / "__init__.py"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    doc = ast.get_docstring(tree) or ""
    cls = _backend_class(package).name
    assert f"{cls}.claim" in doc and "_backend.py" in doc, "the docstring names the claim path"
    kinds = [type(node).__name__ for node in tree.body[1:]]
    assert set(kinds) <= {"ImportFrom", "Assign"}, kinds  # the imports and __all__ only


@pytest.mark.parametrize("package", PACKAGES)
def test_backend_py_holds_the_contract_methods_in_the_contract_order(package: str) -> None:
    node = _backend_class(package)
    assert out_of_order(node, _is_lease(node)) == []


def test_the_memory_backend_keeps_the_contract_order() -> None:
    node = _classes(SOURCE / "backends" / "memory.py")["MemoryBackend"]
    assert out_of_order(node, lease=True) == []


def test_the_order_check_sees_a_method_out_of_place() -> None:
    source = (
        "class B(LeaseBackend):\n    async def renew(self): ...\n    async def claim(self): ...\n"
    )
    [node] = [n for n in ast.parse(source).body if isinstance(n, ast.ClassDef)]
    assert out_of_order(node, lease=True) == ["renew before claim"]
    assert out_of_order(node, lease=False) == []  # renew is no Backend method
