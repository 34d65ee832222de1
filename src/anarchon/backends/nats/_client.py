"""Opening the nats-py client a backend connects itself, and watching it: its connect options
(a few quick tries per server, then reconnects forever), the guard that refuses plain text when
TLS was asked for, the size of each socket read, and nats-py's liveness callbacks (one WARNING
per outage).

A client the caller passes in is used as it is: none of this applies to it. :class:`Opener` is
the one :class:`._connection.Connection` uses.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Final

from ...errors import MissingDependency
from ...kit import Action, log_fields
from . import _errors as errors
from . import _timings as timings
from ._options import servers_shown
from ._wire import OPENED

if TYPE_CHECKING:
    from nats.aio.client import Client as NATS

logger = logging.getLogger("anarchon.backends.nats")

# Bytes each read of the socket asks for, on the connections this backend opens. asyncio asks
# for 256 KiB, above glibc's mmap threshold, so every read mapped a fresh buffer, faulted it in
# and unmapped it again: about 12 us a read here, where an ack or a claim of the feed is a few
# hundred bytes and nats-py parses at most 32 KiB at a time.
READ_SIZE: Final = 64 * 1024


def import_nats() -> Any:
    """The nats package, or :class:`MissingDependency` saying how to install it."""
    try:
        import nats
        import nats.errors
        import nats.js.api
    except ImportError as exc:
        raise MissingDependency(
            "NatsBackend needs the nats-py client: pip install 'anarchon[nats]'"
        ) from exc
    return nats


def where(nc: NATS) -> str:
    """host:port of the server a client is connected to (never its credentials)."""
    url = nc.connected_url
    return f"{url.hostname}:{url.port}" if url is not None else "?"


def set_read_size(nc: NATS) -> None:
    """Make each read of the client's socket ask for :data:`READ_SIZE` bytes (a plain TCP
    connection's asyncio transport; a TLS one reads through its own buffer, uvloop's into one
    buffer per loop, and both are left alone)."""
    writer = getattr(getattr(nc, "_transport", None), "_io_writer", None)
    transport = getattr(writer, "transport", None)
    if transport is not None and isinstance(getattr(transport, "max_size", None), int):
        transport.max_size = READ_SIZE


def abort_socket(nc: NATS) -> None:
    """Drop the client's connection at once, the bytes it has not sent yet with it (asyncio's
    ``abort``; the TLS layer's and the plain socket's), so that a close waiting for them to be
    sent ends."""
    transport = getattr(nc, "_transport", None)
    for name in ("_io_writer", "_bare_io_writer"):
        layer = getattr(getattr(transport, name, None), "transport", None)
        if layer is not None:
            with contextlib.suppress(Exception):
                layer.abort()


class ReconnectWatch:
    """Drops the old connection of a client whose reconnect waits for it to close for ever.

    nats-py's reconnect first closes the lost connection and waits, unbounded, until asyncio has
    sent every byte it holds: a server that reads nothing (a paused process) but whose kernel
    still acknowledges keeps that wait, and the client never tries another server. :meth:`check`,
    called every :data:`._timings.TICK_S` by the guard, remembers the connection a reconnect
    started with; still reconnecting :data:`._timings.CLOSE_WAIT_S` later on that same
    connection (nats-py makes a new one per attempt, so an attempt is never dropped), it drops
    it (:func:`abort_socket`), once, with a WARNING. Reads attributes only: no request.
    """

    def __init__(self) -> None:
        self._transport: object | None = None
        self._since = 0.0
        self._dropped: object | None = None

    def check(self, nc: NATS | None, now: float) -> None:
        """Look at ``nc`` at loop time ``now``: drop its old connection if it is stuck."""
        transport = getattr(nc, "_transport", None)
        if nc is None or transport is None or not nc.is_reconnecting:
            self._transport = None
            return
        if transport is not self._transport:
            self._transport, self._since = transport, now
            return
        if transport is self._dropped or now - self._since < timings.CLOSE_WAIT_S:
            return
        self._dropped = transport
        abort_socket(nc)
        logger.warning(
            "NATS: the old connection did not close within %.0f s (the server reads nothing); "
            "dropped so the client can reconnect",
            timings.CLOSE_WAIT_S,
            extra=log_fields(Action.BACKEND_UNAVAILABLE),
        )


#: The closes still running after :func:`close_client` gave up on them: the event loop holds its
#: tasks weakly.
_ABANDONED: set[asyncio.Future[None]] = set()


async def close_client(nc: NATS) -> None:
    """Close a client this backend opened (nats-py's ``close()``) within
    :data:`._timings.CLOSE_WAIT_S` and :data:`._timings.CLOSE_ABORT_S`, never longer.

    nats-py's close writes what is pending, closes the socket and waits until asyncio has
    sent every byte of it: a server that stopped reading (a paused process, a peer gone
    without a word) keeps that wait, and the application's shutdown, for ever. Past
    :data:`._timings.CLOSE_WAIT_S` the socket is dropped with what it holds
    (:func:`abort_socket`); a close still running :data:`._timings.CLOSE_ABORT_S` after that is
    cancelled and left, logged."""
    closing = asyncio.ensure_future(nc.close())
    try:
        done, _ = await asyncio.wait({closing}, timeout=timings.CLOSE_WAIT_S)
        if not done:
            abort_socket(nc)
            done, _ = await asyncio.wait({closing}, timeout=timings.CLOSE_ABORT_S)
            logger.warning(
                "NATS: the connection did not close within %.0f s (the server reads nothing "
                "more): dropped with what it had not sent%s",
                timings.CLOSE_WAIT_S,
                "" if done else f"; its close still ran {timings.CLOSE_ABORT_S:.0f} s later, left",
                extra=log_fields(Action.BACKEND_UNAVAILABLE),
            )
    except BaseException:  # cancelled: drop the connection rather than leave it closing
        abort_socket(nc)
        raise
    finally:
        if not closing.done():
            closing.cancel()
            _ABANDONED.add(closing)
            closing.add_done_callback(_ABANDONED.discard)
        closing.add_done_callback(_closed)


def _closed(closing: asyncio.Future[None]) -> None:
    """The outcome of a close (:func:`close_client`), consumed: an error is only logged."""
    if closing.cancelled():
        return
    exc = closing.exception()
    if exc is not None:
        logger.debug("NATS: closing the connection: %s", errors.describe(exc))


def server_at_least(nc: NATS, major: int, minor: int) -> bool:
    """True if the server this client is connected to is at least ``major.minor``."""
    info: dict[str, Any] = getattr(nc, "_server_info", None) or {}
    try:
        numbers = [int(x) for x in str(info.get("version", "0.0")).split("-")[0].split(".")[:2]]
    except ValueError:
        return False
    return tuple(numbers) >= (major, minor)


def plain_text_refused(where: str) -> Exception:
    """The error for a server at ``where`` that offers no TLS to a client that asked for it:
    a :class:`nats.errors.SecureConnWantedError` (a refusal, not retried), saying why."""
    import nats.errors

    class PlainTextRefused(nats.errors.SecureConnWantedError):
        def __str__(self) -> str:
            return (
                f"the server at {where} offers no TLS, but TLS was asked for (a tls:// URL, "
                "ca_file or cert_file): refusing to connect in plain text (credentials and "
                "claims would travel unencrypted). Enable TLS on the server (a 'tls {...}' "
                "block), or use a nats:// URL without TLS files if plain text is intended"
            )

    return PlainTextRefused()


def require_tls(client: NATS, *, given_context: bool) -> None:
    """Make ``client`` refuse, before it sends its CONNECT (credentials included), a server
    that does not use TLS when TLS was asked for: a ``tls://`` server URL, or a TLS context
    (``ca_file`` / ``cert_file``). nats-py itself upgrades only when the server requires TLS,
    and otherwise connects in plain text, password and all."""
    original = client._connect_command

    def guarded() -> bytes:
        server = client._current_server
        wanted = given_context or (server is not None and server.uri.scheme == "tls")
        if wanted and not (client._server_info or {}).get("tls_required"):
            uri = server.uri if server is not None else None
            where = f"{uri.hostname}:{uri.port}" if uri is not None else "?"
            raise plain_text_refused(where)
        return original()

    client._connect_command = guarded  # type: ignore[method-assign]


class Opener:
    """Connects the client of a :class:`._connection.Connection` that was given none, and
    hears nats-py's callbacks on it: a failed connect says its telling cause, an outage is
    one WARNING when it starts and one when it ends.

    :param shown: the server URLs as the caller gave them, for messages (redacted there).
    :param scrub: what removes the passwords and tokens the backend was given from a text.
    :param current: the client the connection holds now (None before it is opened and once
        it is closed: nats-py's close calls the disconnected callback too).
    """

    def __init__(
        self,
        *,
        servers: Sequence[str],
        shown: Sequence[str],
        connect_options: dict[str, Any],
        scrub: Callable[[str], str],
        current: Callable[[], NATS | None],
    ) -> None:
        self.servers = list(servers)
        self._shown = list(shown)
        self._connect_options = connect_options
        self.scrub = scrub
        self._current = current
        self._down = False
        self._connecting = False
        self._connect_error: Exception | None = None
        self._connect_fatal = asyncio.Event()

    async def connect(self) -> NATS:
        """A new client, connected to one of the servers within a few tries; else
        BackendUnavailable (no server reached) or BackendError (refused), saying why."""
        nats = import_nats()
        from nats.aio.client import Client

        self._connecting = True
        self._connect_error = None
        self._connect_fatal = asyncio.Event()
        client = Client()  # as nats.connect() makes it, to guard its CONNECT first
        require_tls(client, given_context=self._connect_options.get("tls") is not None)
        connect: Any = client.connect  # nats.connect's loose typing (float timeouts)
        attempt = asyncio.ensure_future(
            connect(
                servers=self.servers,
                name="anarchon",
                connect_timeout=timings.CONNECT_TIMEOUT_S,
                reconnect_time_wait=timings.RECONNECT_WAIT_S,
                max_reconnect_attempts=timings.CONNECT_ATTEMPTS,
                ping_interval=timings.PING_INTERVAL_S,
                max_outstanding_pings=timings.MAX_OUTSTANDING_PINGS,
                # No reconnect buffer: a claim published while disconnected fails at once
                # (retried, fail closed) instead of being sent whenever the connection is back,
                # possibly after its slot left the duplicate window (CLAIM_MARGIN_MS).
                pending_size=-1,
                error_cb=self._on_error,
                disconnected_cb=self._on_disconnected,
                reconnected_cb=self._on_reconnected,
                **self._connect_options,
            )
        )
        fatal = asyncio.ensure_future(self._connect_fatal.wait())
        # nats-py can hang after a TLS verification failure (it never gives up on closing the
        # half-open connection): stop at once on such an error, and bound the whole attempt.
        limit = (
            (timings.CONNECT_TIMEOUT_S + timings.RECONNECT_WAIT_S)
            * (timings.CONNECT_ATTEMPTS + 1)
            * len(self.servers)
        )
        try:
            await asyncio.wait({attempt, fatal}, timeout=limit, return_when="FIRST_COMPLETED")
            if not attempt.done():
                attempt.cancel()
                await asyncio.gather(attempt, return_exceptions=True)
                raise TimeoutError(f"no connection within {limit:.0f} s")
            attempt.result()
            nc: NATS = client
        except (OSError, TimeoutError, nats.errors.Error) as exc:
            cause = self._connect_error if self._connect_error is not None else exc
            raise errors.connect_error(
                cause,
                self.scrub(
                    f"cannot connect to NATS at {servers_shown(self._shown)}: "
                    f"{errors.describe(cause)}. {errors.connect_advice(cause)}"
                ),
            ) from None
        except BaseException:  # cancelled (a stop during the start): leave nothing connecting
            attempt.cancel()
            await asyncio.gather(attempt, return_exceptions=True)
            with contextlib.suppress(Exception):
                await client.close()
            raise
        finally:
            fatal.cancel()
            self._connecting = False
        # The first connection fails fast; from now on a lost connection is retried forever.
        nc.options["max_reconnect_attempts"] = -1
        set_read_size(nc)
        OPENED.add(nc)
        return nc

    # -- liveness: nats-py's callbacks, one WARNING per outage -------------------------------

    async def _on_error(self, exc: Exception) -> None:
        # nats-py calls this for every failed (re)connect attempt and for the loss that starts
        # an outage; _on_disconnected says it once per outage, so those stay at debug level.
        import nats.errors

        if self._connecting:
            # Keep the telling cause (refused credentials, a certificate that does not verify)
            # over the reset that follows it, and over another server's refused connection.
            before = self._connect_error
            if before is None or (
                not errors.is_refused(before)
                and (errors.is_refused(exc) or not isinstance(exc, OSError))
            ):
                self._connect_error = exc
            if errors.is_refused(exc):
                self._connect_fatal.set()  # retrying cannot help
        lost = isinstance(exc, OSError | nats.errors.StaleConnectionError)
        text = self.scrub(errors.describe(exc))
        if self._connecting or self._down or lost:
            logger.debug("NATS: %s", text, extra=log_fields(Action.NATS_ERROR))
        else:
            logger.warning("NATS: %s", text, extra=log_fields(Action.NATS_ERROR))

    async def _on_disconnected(self) -> None:
        if self._down or self._connecting or self._current() is None:
            return
        self._down = True
        logger.warning(
            "disconnected from NATS; reconnecting every %.1f s (claims fail closed meanwhile)",
            timings.RECONNECT_WAIT_S,
            extra=log_fields(Action.BACKEND_UNAVAILABLE),
        )

    async def _on_reconnected(self) -> None:
        self._down = False
        nc = self._current()
        if nc is not None:
            set_read_size(nc)  # a new socket
        url = where(nc) if nc is not None else "?"
        logger.warning("reconnected to NATS at %s", url, extra=log_fields(Action.BACKEND_RECOVERED))
