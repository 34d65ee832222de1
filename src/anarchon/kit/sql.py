"""Named SQL queries kept in ``.sql`` files next to each SQL backend."""

from __future__ import annotations

import re
from importlib import resources

__all__ = ["load_queries"]

_NAME = re.compile(r"^--\s*name:\s*([a-z_][a-z0-9_]*)\s*$", re.MULTILINE)


def load_queries(package: str, filename: str) -> dict[str, str]:
    """Return the queries of ``package/filename``, each introduced by a ``-- name: x`` line."""
    text = resources.files(package).joinpath(filename).read_text(encoding="utf-8")
    parts = _NAME.split(text)
    queries: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        queries[name] = body.strip()
    return queries
