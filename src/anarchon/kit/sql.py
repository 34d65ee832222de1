"""Named SQL queries for SQL backends: one file of ``-- name: x`` sections per backend."""

from __future__ import annotations

from ..backends._sql import load_queries

__all__ = ["load_queries"]
