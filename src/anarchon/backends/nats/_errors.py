"""The one place where nats-py's exceptions become anarchon's.

Transient (retried here with the same message id and token, then
:class:`~anarchon.errors.BackendUnavailable`): timeouts, no responders (no stream leader during
an election, JetStream not answering), connection lost or reconnecting, a full reconnect buffer,
and JetStream's "duplicate message id is in process" (409/10158, clustered streams on 2.11+).
Anything else JetStream answers is permanent: :class:`~anarchon.errors.BackendError`.

Connecting (:func:`connect_error`): no server reached (refused, reset, no route, a name that
does not resolve, no answer in time) is :class:`~anarchon.errors.BackendUnavailable`, as for
PostgreSQL and Redis; a server that refuses this client (credentials, a certificate that does
not verify, TLS required or not offered) is :class:`~anarchon.errors.BackendError`.
"""

from __future__ import annotations

import asyncio
import ssl
from typing import Any, Final

from ...errors import BackendError, BackendUnavailable

#: JetStream error codes (``err_code``) the backend reacts to by number, never by message text.
NO_MESSAGE: Final = 10037
STREAM_NOT_FOUND: Final = 10059
STREAM_NAME_IN_USE: Final = 10058
SUBJECTS_OVERLAP: Final = 10065
REPLICAS_NOT_CLUSTERED: Final = 10074
NO_SUITABLE_PEERS: Final = 10005
WINDOW_VS_MAX_AGE: Final = 10052
JETSTREAM_NOT_ENABLED_FOR_ACCOUNT: Final = 10039
JETSTREAM_NOT_ENABLED: Final = 10076
DUPLICATE_IN_PROCESS: Final = 10158
# A compare-and-set write lost: the subject's last sequence is not the one expected (with the
# sequence in the text, or without: newer servers send either).
WRONG_LAST_SEQUENCE: Final = frozenset({10071, 10164})
# Answers a cluster gives while a leader is being elected or a peer catches up: temporarily
# unavailable, incomplete results, not assigned, not leader, stream offline.
TRANSIENT_ERR_CODES: Final = frozenset({DUPLICATE_IN_PROCESS, 10008, 10004, 10007, 10009, 10118})


class JetStreamError(BackendError):
    """JetStream answered a request with an error; ``code`` and ``err_code`` are its numbers."""

    def __init__(self, message: str, *, code: int | None, err_code: int | None) -> None:
        super().__init__(message)
        self.code = code
        self.err_code = err_code


class InFlight(Exception):
    """A duplicate ack with sequence 0: the original is proposed but not yet stored (2.10
    clusters). Retried like a transient error."""


def is_transient(exc: BaseException) -> bool:
    """True for failures that a retry with the same message id may cure."""
    import nats.errors
    import nats.js.errors

    if isinstance(exc, nats.js.errors.ServiceUnavailableError) and exc.err_code is None:
        return True  # no responders to a JetStream API request: nobody leads right now
    if isinstance(exc, JetStreamError | nats.js.errors.APIError):
        return getattr(exc, "err_code", None) in TRANSIENT_ERR_CODES  # some lack it
    return isinstance(
        exc,
        InFlight
        | TimeoutError
        | asyncio.TimeoutError
        | OSError
        | nats.errors.TimeoutError
        | nats.errors.NoRespondersError
        | nats.js.errors.NoStreamResponseError
        | nats.errors.ConnectionReconnectingError
        | nats.errors.OutboundBufferLimitError
        | nats.errors.StaleConnectionError
        | nats.errors.FlushTimeoutError,
    )


def maybe_sent(exc: BaseException) -> bool:
    """True if a publish that failed with ``exc`` may still have been stored: it went out and
    no answer came (a timeout, the connection lost meanwhile). False when the server answered
    (no responders, an API error, an in-flight duplicate) or nothing was sent (closed, no
    reconnect buffer)."""
    import nats.errors
    import nats.js.errors

    if isinstance(
        exc,
        InFlight
        | nats.js.errors.APIError
        | nats.js.errors.NoStreamResponseError
        | nats.errors.NoRespondersError
        | nats.errors.OutboundBufferLimitError
        | nats.errors.ConnectionClosedError
        | nats.errors.ConnectionDrainingError,
    ):
        return False
    return is_transient(exc)


def is_unanswered(exc: BaseException) -> bool:
    """True if a request that failed with ``exc`` was taken by nobody, so nothing was stored and
    it may be made again without writing twice: transient (:func:`is_transient`) and not
    :func:`maybe_sent` (no responders, a leader being elected; never a timeout)."""
    return is_transient(exc) and not maybe_sent(exc)


def is_closed(exc: BaseException) -> bool:
    """True if the connection is closed for good (stopped, or out of reconnect attempts)."""
    import nats.errors

    return isinstance(exc, nats.errors.ConnectionClosedError | nats.errors.ConnectionDrainingError)


def is_refused(exc: BaseException) -> bool:
    """True if a connection attempt failed because the server, or the TLS handshake, refused
    this client: wrong or expired credentials, a certificate that does not verify or is missing,
    TLS required by one side and not offered by the other. Retrying cannot help. (A server that
    drops a client without a certificate before the handshake's alert arrives looks like a
    reset: that reads as unreachable.)"""
    import nats.errors

    refusals = (
        nats.errors.AuthorizationError
        | nats.errors.InvalidUserCredentialsError
        | nats.errors.SecureConnRequiredError
        | nats.errors.SecureConnWantedError
        | ssl.SSLError  # the handshake failed: verification, an alert (certificate required)
    )
    cut = ssl.SSLEOFError | ssl.SSLZeroReturnError | ssl.SSLSyscallError  # the link went
    if isinstance(exc, refusals) and not isinstance(exc, cut):
        return True
    return "authorization violation" in str(exc).lower()


def is_unreachable(exc: BaseException) -> bool:
    """True if a connection attempt failed because no server could be reached or answered in
    time (refused, reset, no route, a host name that does not resolve, a timeout): a server
    that is down or restarting, which a later attempt may find."""
    import nats.errors

    lost = OSError | TimeoutError | nats.errors.NoServersError | nats.errors.StaleConnectionError
    return isinstance(exc, lost) and not is_refused(exc)


def connect_error(exc: BaseException, message: str) -> BackendError:
    """The anarchon error for a failed connection attempt whose cause is ``exc``:
    :class:`~anarchon.errors.BackendUnavailable` if no server was reached
    (:func:`is_unreachable`), else :class:`~anarchon.errors.BackendError`."""
    return (BackendUnavailable if is_unreachable(exc) else BackendError)(message)


def connect_advice(exc: BaseException) -> str:
    """What to change when a connection attempt failed with ``exc``: the credentials when the
    server refused them, else everything a connection needs."""
    import nats.errors

    refused = nats.errors.AuthorizationError | nats.errors.InvalidUserCredentialsError
    if isinstance(exc, refused) or "authorization violation" in str(exc).lower():
        return (
            "The server refused the credentials: give the user and password, the token or the "
            ".creds file its authorization accepts (in the URL or NatsBackend's options)"
        )
    return (
        "Check that nats-server runs there, with JetStream enabled (nats-server -js), and "
        "that the URL, credentials and TLS files are right"
    )


def describe(exc: BaseException) -> str:
    """A short text for an exception from nats-py (whose ``str()`` is often empty)."""
    import nats.js.errors

    if isinstance(exc, InFlight):
        return "the claim is still being stored by the stream leader (duplicate ack with seq 0)"
    if isinstance(exc, nats.js.errors.NoStreamResponseError):
        return "no stream answered (leader election in progress, or no stream for the subject)"
    if isinstance(exc, nats.js.errors.APIError):
        return f"{exc.description or type(exc).__name__} (code {exc.code}, err_code {exc.err_code})"
    text = str(exc).removeprefix("nats: ")
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def api_error(error: dict[str, Any]) -> JetStreamError:
    """The error object of a JetStream API reply as an exception."""
    code, err_code = error.get("code"), error.get("err_code")
    text = error.get("description") or "unknown error"
    return JetStreamError(
        f"{text} (code {code}, err_code {err_code})", code=code, err_code=err_code
    )


def translate(exc: BaseException, doing: str) -> BackendError:
    """Return the anarchon error for a failure of ``doing`` (e.g. "claiming sync:1700000000000")."""
    if isinstance(exc, BackendError) and not isinstance(exc, JetStreamError):
        return exc
    if is_closed(exc):
        return BackendUnavailable(f"NATS: {doing} failed: the connection is closed")
    if is_transient(exc):
        return BackendUnavailable(f"NATS: {doing} failed: {describe(exc)}")
    return BackendError(f"NATS: {doing} failed: {describe(exc)}")
