"""Checks of a backend's names by pattern: a schema, a table prefix, a stream, a subject prefix.

Each backend names its rule in words (what the value must be, and why); the check and the
shape of the error are written once here.
"""

from __future__ import annotations

import re

from ..errors import InvalidOption

__all__ = ["check_pattern"]


def check_pattern(option: str, value: object, rule: re.Pattern[str], must: str) -> str:
    """Return ``value`` if it is a string that ``rule`` matches whole; else raise
    :class:`~anarchon.errors.InvalidOption` as ``<option>=<value!r> <must>``, where ``must``
    says the rule in words (``"must be 1-63 characters of ..."``)."""
    if not isinstance(value, str) or not rule.fullmatch(value):
        raise InvalidOption(f"{option}={value!r} {must}")
    return value
