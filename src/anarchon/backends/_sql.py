"""Compatibility shim: the SQL loader lives in :mod:`anarchon.kit.sql` (import from there)."""

from __future__ import annotations

from ..kit.sql import *  # noqa: F403
