"""The one translation of redis-py's exceptions into anarchon's errors.

Transient (:class:`~anarchon.errors.BackendUnavailable`, retried with backoff by the core):
connection refused or lost, timeouts, a server still loading its data set, a cluster that is
down or resharding, writes refused by a replica during a failover, a server out of memory or
busy with a script. Permanent (:class:`~anarchon.errors.BackendError`): authentication,
permissions, anything else the server answers with an error.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from ...errors import BackendError, BackendUnavailable

if TYPE_CHECKING:
    from ...kit.calls import Translate

__all__ = [
    "is_driver_error",
    "is_permission_refused",
    "is_transient",
    "is_unreachable",
    "translate",
    "translator",
]

# Error replies (by their first word) that say "not now" rather than "never".
TRANSIENT_REPLIES: Final = (
    "BUSY",
    "MISCONF",
    "NOREPLICAS",
    "OOM",
    "LOADING",
    "MASTERDOWN",
    "READONLY",
)


def is_driver_error(exc: BaseException) -> bool:
    """True for what redis-py raises when a call fails (not for bugs in our code)."""
    import redis.exceptions as rx

    return isinstance(exc, rx.RedisError | rx.RedisClusterException | OSError | TimeoutError)


def is_permission_refused(error: BaseException) -> bool:
    """True if ``error`` is Redis refusing a permission (an ACL), not an outage."""
    import redis.exceptions as rx

    cause = error.__cause__
    return isinstance(cause, rx.NoPermissionError) or "NOPERM" in str(error)


def is_transient(exc: BaseException) -> bool:
    """True if ``exc`` (raised by redis-py) says "not now" rather than "never"."""
    import redis.exceptions as rx

    if isinstance(exc, rx.AuthenticationError | rx.AuthorizationError | rx.NoPermissionError):
        return False
    transient = (
        rx.ConnectionError,  # also BusyLoadingError, MasterNotFoundError (Sentinel)
        rx.TimeoutError,
        rx.ClusterDownError,  # also MasterDownError
        rx.TryAgainError,
        rx.ReadOnlyError,
        rx.OutOfMemoryError,
        rx.ClusterError,
        rx.RedisClusterException,  # e.g. SlotNotCoveredError while the cluster reshapes
        ConnectionError,
        TimeoutError,
        OSError,
    )
    if isinstance(exc, transient):
        return True
    return isinstance(exc, rx.ResponseError) and str(exc).split(" ", 1)[0] in TRANSIENT_REPLIES


def is_unreachable(exc: BaseException) -> bool:
    """True if ``exc`` (raised by redis-py) says Redis could not be reached or stopped
    answering, rather than answering with an error reply (OOM, READONLY ...)."""
    import redis.exceptions as rx

    reached = rx.AuthenticationError | rx.AuthorizationError | rx.NoPermissionError
    lost = rx.ConnectionError | rx.TimeoutError | ConnectionError | TimeoutError | OSError
    return isinstance(exc, lost) and not isinstance(exc, reached)


def translate(exc: BaseException, where: str) -> BackendError:
    """Return the anarchon error for a driver exception raised while talking to ``where``."""
    import redis.exceptions as rx

    text = f"Redis {where}: {type(exc).__name__}: {_with_reason(exc)}"
    if isinstance(exc, rx.AuthenticationError | rx.AuthorizationError | rx.NoPermissionError):
        return BackendError(text + " (check the URL's credentials and the user's ACL)")
    if is_transient(exc):
        return BackendUnavailable(text)
    if isinstance(exc, rx.ResponseError) and "DB index is out of range" in str(exc):
        return BackendError(
            text + " (the database number, the URL's path, must be below the server's "
            "'databases' setting, 16 unless changed)"
        )
    return BackendError(text)


def _with_reason(exc: BaseException) -> str:
    """``exc``'s message, and the socket or TLS error it wraps when the message leaves its words
    out: redis-py 5 writes a wrapped error's number twice instead of its text (``Error 1
    connecting to h:6380. 1.`` for a certificate that does not verify)."""
    wrapped = exc.__cause__ or exc.__context__
    text = str(exc)
    if not isinstance(wrapped, OSError):
        return text
    words = wrapped.strerror or str(wrapped)
    return text if not words or words in text else f"{text} ({type(wrapped).__name__}: {words})"


def translator(where: str) -> Translate:
    """:func:`translate` for :func:`anarchon.kit.calls.bounded_call`: None for what is not
    redis-py's (raised unchanged)."""

    def translated(exc: BaseException) -> BackendError | None:
        return translate(exc, where) if is_driver_error(exc) else None

    return translated
