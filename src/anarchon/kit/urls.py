"""Backend URLs: the one redactor and the one splitter of URL options.

Every ``from_url`` splits its URL the same way: the options a backend knows are taken out of
the query and converted (:func:`int_option`, :func:`bool_option`, :func:`str_option`,
:func:`as_given`, :func:`ms_option`), the rest is either passed on to the driver exactly as
written (``pass_on=True``) or refused with one message naming the option, the URL (redacted) and
the options that are known.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

from .._options import Bound, check_int
from .._redact import redact_url
from ..errors import InvalidOption

__all__ = [
    "Converter",
    "SplitURL",
    "as_given",
    "bool_option",
    "int_option",
    "ms_option",
    "redact_url",
    "split_url",
    "str_option",
]

Converter = Callable[[str, str, str], Any]
"""``(option, text, shown_url)`` to a value; raises :class:`~anarchon.errors.InvalidOption`."""

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


def int_option(bound: Bound) -> Converter:
    """A converter to an integer inside ``bound``."""

    def convert(option: str, text: str, shown: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise InvalidOption(
                f"{option}={text!r} in the backend URL {shown!r} must be {bound}"
            ) from None
        return check_int(option, value, bound, f"the backend URL {shown!r}")

    return convert


def ms_option(bound: Bound) -> Converter:
    """A converter to a duration in milliseconds inside ``bound`` (``bound.ms`` for messages)."""
    return int_option(Bound(bound.low, bound.high, ms=True))


def bool_option(option: str, text: str, shown: str) -> bool:
    """A converter to True (``1``, ``true``, ``yes``, ``on``) or False (``0``, ``false`` ...)."""
    lowered = text.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise InvalidOption(
        f"{option}={text!r} in the backend URL {shown!r} must be true or false (or 1 or 0)"
    )


def str_option(option: str, text: str, shown: str) -> str:
    """A converter that keeps the text; refuses an empty value."""
    if not text:
        raise InvalidOption(f"{option}= in the backend URL {shown!r} must not be empty")
    return text


def as_given(option: str, text: str, shown: str) -> str:
    """A converter that keeps the text, empty included, for an option the backend's constructor
    checks by its own rule (a key prefix, a schema name)."""
    return text


@dataclass(frozen=True, slots=True)
class SplitURL:
    """A backend URL with its options taken out."""

    url: str
    """The URL without the options the backend knows (the driver's own options stay)."""
    options: dict[str, Any]
    """The known options given, converted."""
    shown: str
    """The URL as messages may show it (passwords and tokens masked)."""


def split_url(
    url: str, known: Mapping[str, Converter], *, pass_on: bool = False, backend: str = "backend"
) -> SplitURL:
    """Take the options in ``known`` out of ``url``'s query and convert them.

    Any other query option is left in :attr:`SplitURL.url` for the driver, exactly as written
    (escapes included: ``+`` and ``%20`` need not mean the same to a driver), when ``pass_on``
    is true, and refused otherwise: :class:`~anarchon.errors.InvalidOption` names the option,
    the URL (redacted) and the known options. An option given twice is refused too.
    """
    shown = redact_url(url)
    parts = urlsplit(url)
    options: dict[str, Any] = {}
    rest: list[str] = []
    for field in parts.query.split("&"):
        if not field:
            continue
        raw_key, _, raw_value = field.partition("=")
        key, value = _decoded(raw_key), _decoded(raw_value)
        convert = known.get(key)
        if convert is None:
            if not pass_on:
                names = ", ".join(sorted(known)) or "none"
                raise InvalidOption(
                    f"the {backend} URL {shown!r} has an unknown option {key!r}; "
                    f"the options it takes are: {names}"
                )
            rest.append(field)
            continue
        if key in options:
            raise InvalidOption(f"the {backend} URL {shown!r} gives the option {key!r} twice")
        options[key] = convert(key, value, shown)
    # Rebuilt by hand: urlunsplit would turn sqlite:////absolute into sqlite://absolute.
    head = url.partition("?")[0].partition("#")[0]
    fragment = f"#{parts.fragment}" if parts.fragment else ""
    plain = head + (f"?{'&'.join(rest)}" if rest else "") + fragment
    return SplitURL(url=plain, options=options, shown=shown)


def _decoded(text: str) -> str:
    """A query string's key or value, decoded (``+`` is a space, ``%xx`` an escape)."""
    return unquote(text.replace("+", " "))
