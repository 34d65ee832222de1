"""The Redis backend's options: checked where they are given, and taken out of a URL.

``prefix`` and ``history_size`` are the backend's own; every other query option of a URL goes to
redis-py. A URL given to the constructor may not carry the backend's options (so a prefix is
never silently ignored): :func:`split_url` is what ``RedisBackend.from_url`` uses.
"""

from __future__ import annotations

import inspect
import math
from typing import Any, Final
from urllib.parse import parse_qsl, urlsplit

from ...errors import InvalidOption, MissingDependency
from ...kit import HISTORY_SIZE, check_int, redact_url
from ...kit.urls import Converter, as_given, int_option
from ...kit.urls import split_url as split_options

__all__ = [
    "DEFAULT_URL",
    "URL_OPTIONS",
    "check_client",
    "check_history_size",
    "check_url",
    "require_driver",
    "split_url",
]

DEFAULT_URL: Final = "redis://localhost:6379/0"


def require_driver() -> None:
    """Raise :class:`MissingDependency` naming the extra to install if redis-py is missing."""
    try:
        import redis.asyncio  # noqa: F401
    except ImportError as exc:
        raise MissingDependency(
            "the Redis backend needs the redis package (redis-py >= 5): "
            "pip install 'anarchon[redis]'"
        ) from exc


def check_history_size(value: object) -> int:
    """Return ``value`` if it is an integer in :data:`~anarchon.kit.HISTORY_SIZE` (every lease
    backend's range), else raise InvalidOption."""
    return check_int("history_size", value, HISTORY_SIZE, "RedisBackend")


# Options the backend takes from a URL's query; the rest of the URL goes to redis-py.
URL_OPTIONS: Final[dict[str, Converter]] = {
    "prefix": as_given,
    "history_size": int_option(HISTORY_SIZE),
}


def check_client(url: str, client: object) -> None:
    """Refuse a client passed together with a URL, or anything that is not a redis-py client."""
    if url != DEFAULT_URL:
        raise InvalidOption(
            f"RedisBackend got both url={redact_url(url)!r} and a client; pass one of them"
        )
    if not hasattr(client, "evalsha") or not hasattr(client, "pipeline"):
        raise InvalidOption(
            f"client={client!r} is not a redis.asyncio.Redis or RedisCluster client"
        )


def check_url(url: object) -> None:
    """Refuse a URL that is not a string, carries the backend's options, or redis-py rejects:
    a value it cannot read, or a query option its connections do not take (redis-py passes
    any option on to the connection, which refuses it only when the first one is made)."""
    from redis.asyncio import ConnectionPool

    if not isinstance(url, str):
        raise InvalidOption(f"url={url!r} must be a string such as {DEFAULT_URL!r}")
    shown = redact_url(url)
    if any(key in URL_OPTIONS for key, _ in parse_qsl(urlsplit(url).query)):
        raise InvalidOption(
            f"Redis URL {shown!r} carries backend options ({', '.join(URL_OPTIONS)}): "
            "use RedisBackend.from_url() or pass them as arguments"
        )
    try:
        pool = ConnectionPool.from_url(url)
    except ValueError as exc:
        raise InvalidOption(f"Redis URL {shown!r} is not valid: {exc}") from None
    unknown = sorted(set(pool.connection_kwargs) - _taken_by(pool.connection_class))
    if unknown:
        raise InvalidOption(
            f"Redis URL {shown!r} has option(s) that redis-py's "
            f"{pool.connection_class.__name__} does not take: {', '.join(unknown)}; the "
            f"backend's own options are {' and '.join(URL_OPTIONS)} (RedisBackend.from_url)"
        )
    _check_durations(shown, pool.connection_kwargs)


SECONDS_OPTIONS: Final = ("socket_timeout", "socket_connect_timeout", "timeout")
"""redis-py's query options in seconds (it reads them with ``float()``, which takes ``nan``,
``inf`` and ``-1``): each must be a finite number above 0."""


def _check_durations(shown: str, options: dict[str, Any]) -> None:
    """Refuse a duration redis-py would take from a URL but cannot use: with
    ``socket_timeout=nan`` the scheduler hung at start without a word, ``0`` or ``-1`` failed
    every command as a timeout (reported as the server out of reach), ``inf`` never times out;
    a negative ``health_check_interval``."""
    for key in SECONDS_OPTIONS:
        value = options.get(key)
        if value is not None and not 0 < value < math.inf:
            raise InvalidOption(
                f"Redis URL {shown!r} has {key}={value!r}: it must be a number of seconds, "
                "above 0 and finite"
            )
    interval = options.get("health_check_interval")
    if interval is not None and interval < 0:
        raise InvalidOption(
            f"Redis URL {shown!r} has health_check_interval={interval!r}: it must be a "
            "number of seconds, 0 (no checks) or more"
        )


def _taken_by(connection_class: type) -> set[str]:
    """The keyword arguments a redis-py connection class takes: its ``__init__``'s and those
    of the classes it passes ``**kwargs`` on to."""
    names: set[str] = set()
    for cls in connection_class.__mro__:
        init = cls.__dict__.get("__init__")
        if init is None:
            continue
        parameters = inspect.signature(init).parameters.values()
        names.update(p.name for p in parameters if p.kind is not p.VAR_KEYWORD)
        if all(p.kind is not p.VAR_KEYWORD for p in parameters):
            break
    return names


def split_url(url: str) -> tuple[str, dict[str, Any]]:
    """Split ``redis://h/0?prefix=app:&history_size=500&socket_timeout=2`` into the URL for
    redis-py (``redis://h/0?socket_timeout=2``, its options as written) and the backend's own
    options, by :func:`anarchon.kit.urls.split_url`."""
    split = split_options(url, URL_OPTIONS, pass_on=True, backend="Redis")
    return split.url, split.options
