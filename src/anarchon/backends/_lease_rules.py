"""Compatibility shim: the lease rules live in :mod:`anarchon.kit.lease` (import from there)."""

from __future__ import annotations

from ..kit.lease import *  # noqa: F403
