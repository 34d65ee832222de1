"""The enum members the per-slot paths and the lease rules read as module constants are defined
once, in :mod:`anarchon._members`, not copied (with their explanation) into each module that reads
them (the kit included).
Backends keep their own copy: they may import only the contract and the kit."""

from __future__ import annotations

import ast
from pathlib import Path

from anarchon import _members

PACKAGE = Path(_members.__file__).resolve().parent


def _member_constants(path: Path) -> set[str]:
    """The ``Enum.MEMBER`` expressions a module binds to a module-level name."""
    found: set[str] = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        value = node.value if isinstance(node, ast.Assign | ast.AnnAssign) else None
        if (
            isinstance(value, ast.Attribute)
            and isinstance(value.value, ast.Name)
            and value.attr.isupper()
            and value.value.id[:1].isupper()
        ):
            found.add(f"{value.value.id}.{value.attr}")
    return found


def test_each_member_constant_is_defined_once() -> None:
    shared = _member_constants(PACKAGE / "_members.py")
    assert len(shared) == len(_members.__all__) == 12
    copies = {
        (path.relative_to(PACKAGE).as_posix(), member)
        for path in PACKAGE.rglob("*.py")
        if path.name != "_members.py" and "backends" not in path.parts
        for member in _member_constants(path) & shared
    }
    assert not copies, f"import these from anarchon._members instead: {sorted(copies)}"


def test_the_constants_are_the_members() -> None:
    for name in _members.__all__:
        member = getattr(_members, name)
        assert type(member)[member.name] is member
        # Its own name, or that name under a prefix (CLAIM_SKIPPED: ClaimStatus.SKIPPED).
        assert name == member.name or name.endswith(f"_{member.name}"), name
