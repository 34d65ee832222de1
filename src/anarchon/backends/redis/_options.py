"""The Redis backend's options: checked where they are given, and taken out of a URL.

``prefix`` and ``history_size`` are the backend's own; every other query option of a URL goes to
redis-py. A URL given to the constructor may not carry the backend's options (so a prefix is
never silently ignored): :func:`split_url` is what ``RedisBackend.from_url`` uses.
"""

from __future__ import annotations

from typing import Any, Final
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from ...errors import InvalidOption, MissingDependency
from ...kit import redact_url

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
# Options the backend takes from a URL's query; the rest of the URL goes to redis-py.
URL_OPTIONS: Final = ("prefix", "history_size")


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
    """Return ``value`` if it is an integer >= 1 (not a bool), else raise InvalidOption."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidOption(f"history_size={value!r} must be an integer >= 1")
    return value


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
    """Refuse a URL that is not a string, carries the backend's options, or redis-py rejects."""
    from redis.connection import parse_url

    if not isinstance(url, str):
        raise InvalidOption(f"url={url!r} must be a string such as {DEFAULT_URL!r}")
    if any(key in URL_OPTIONS for key, _ in parse_qsl(urlsplit(url).query)):
        raise InvalidOption(
            f"Redis URL {redact_url(url)!r} carries backend options ({', '.join(URL_OPTIONS)}): "
            "use RedisBackend.from_url() or pass them as arguments"
        )
    try:
        parse_url(url)  # type: ignore[no-untyped-call]
    except ValueError as exc:
        raise InvalidOption(f"Redis URL {redact_url(url)!r} is not valid: {exc}") from None


def split_url(url: str) -> tuple[str, dict[str, Any]]:
    """Split ``redis://h/0?prefix=app:&history_size=500&socket_timeout=2`` into the URL for
    redis-py (``redis://h/0?socket_timeout=2``) and the backend's own options."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    ours = {key: value for key, value in query if key in URL_OPTIONS}
    rest = urlencode([(key, value) for key, value in query if key not in URL_OPTIONS])
    options: dict[str, Any] = {}
    if "prefix" in ours:
        options["prefix"] = ours["prefix"]
    if "history_size" in ours:
        try:
            options["history_size"] = int(ours["history_size"])
        except ValueError:
            raise InvalidOption(
                f"history_size={ours['history_size']!r} in the Redis URL must be an integer"
            ) from None
    return urlunsplit(parts._replace(query=rest)), options
