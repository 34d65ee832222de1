"""``python -m anarchon`` is the ``anarchon`` command."""

from __future__ import annotations

from .cli import main

main()
