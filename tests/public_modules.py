"""The public modules: ``anarchon`` and every module of it whose path has no part starting with
``_`` (the tests of the public surface, its types and its docs, all walk the same list)."""

from __future__ import annotations

import pkgutil

import anarchon


def module_names() -> list[str]:
    """``anarchon`` and every module of it whose path has no private part."""
    found = ["anarchon"]
    for info in pkgutil.walk_packages(anarchon.__path__, "anarchon."):
        if not any(part.startswith("_") for part in info.name.split(".")):
            found.append(info.name)
    return found
