"""The NATS client calls: connecting, liveness and reconnects, and every request bounded,
retried on transient failures and translated into anarchon's errors.

Everything that talks to nats-py goes through :class:`Connection`: JetStream API requests (the
server's own JSON), publishes with a message id, reads of one stored message, reads of a job's
subjects through a short-lived consumer, and the server's clock. The rest of the package decides
what to ask; this module decides how long to wait, when to retry and what a failure means. How a
publish and its ack travel, past nats-py's own publish and subscription paths, is in
:mod:`._wire`.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any, Final, TypeVar

from ...errors import BackendError, BackendUnavailable, MissingDependency
from ...kit import backoff
from ...kit.calls import bounded_call
from . import _errors as errors
from . import _records as records
from . import _stream as stream_setup
from . import _subjects as subjects
from ._errors import InFlight, JetStreamError
from ._options import scrub, servers_shown
from ._records import Stored
from ._wire import OPENED, Ack, Acks, Writer

if TYPE_CHECKING:
    from nats.aio.client import Client as NATS
    from nats.js import JetStreamContext
    from nats.js.kv import KeyValue

logger = logging.getLogger("anarchon.backends.nats")

T = TypeVar("T")
Item = TypeVar("Item")
Answer = TypeVar("Answer")

# Connecting: a few quick tries per server so start() fails within seconds; once connected the
# client reconnects forever, every half second, and pings every 10 s so a dead TCP connection
# is noticed in about 30 s instead of nats-py's default of several minutes.
CONNECT_TIMEOUT_S: Final = 2.0
CONNECT_ATTEMPTS: Final = 2
RECONNECT_WAIT_S: Final = 0.5
PING_INTERVAL_S: Final = 10
MAX_OUTSTANDING_PINGS: Final = 3
# One request (publish, get, API call) waits this long for its answer; a failover takes a few
# seconds of "no responders", so a call is retried (a claim with the same id and token) for up
# to CLAIM_RETRY_S, with short pauses (an in-flight duplicate is settled in tens of ms).
REQUEST_TIMEOUT_S: Final = 2.0
CLAIM_RETRY_S: Final = 8.0
START_RETRY_S: Final = 10.0
RETRY_FIRST_S: Final = 0.025
RETRY_CAP_S: Final = 0.5
MAX_ATTEMPTS: Final = 12
# A key-value bucket's write or lookup is made again for up to this long while nobody answers
# it (until_answered): a bucket just created, an election. Under the buckets' call timeout.
BUCKET_RETRY_S: Final = 3.0
# Claims of one batch in flight at once: enough to fill the pipe, bounded so a batch of
# thousands does not overflow nats-py's reconnect buffer.
MAX_IN_FLIGHT: Final = 256
FETCH_BATCH: Final = 500
# Bytes each read of the socket asks for, on the connections this backend opens. asyncio asks
# for 256 KiB, above glibc's mmap threshold, so every read mapped a fresh buffer, faulted it in
# and unmapped it again: about 12 us a read here, where an ack or a claim of the feed is a few
# hundred bytes and nats-py parses at most 32 KiB at a time.
READ_SIZE: Final = 64 * 1024
CONSUMER_INACTIVE_S: Final = 30.0


#: What each kind of key-value bucket beside the stream holds (``_registry.BUCKET_KINDS``),
#: and what losing it costs.
BUCKET_LOSS: Final = {
    "registry": (
        "the instances' records; each running instance writes its own again at its next heartbeat"
    ),
    "definitions": (
        "the job definitions the instances saved; each running instance saves its own again "
        "within a minute (until then readers may not find the jobs of some instances)"
    ),
    "control": (
        "the pauses and run requests; paused jobs run again until they are paused anew, and "
        "pending run requests (triggers and retries) are dropped"
    ),
}


def bucket_loss(bucket: str) -> str:
    """What losing key-value bucket ``bucket`` cost (:data:`BUCKET_LOSS`, by its name)."""
    for kind, text in BUCKET_LOSS.items():
        if bucket.endswith(f"_{kind}") or bucket.startswith(f"anarchon_{kind}_"):
            return text
    return "its keys"


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


def _where(nc: NATS) -> str:
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


def _server_at_least(nc: NATS, major: int, minor: int) -> bool:
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


async def cancel_unfinished(task: asyncio.Future[Any] | None) -> None:
    """Cancel ``task`` if it is still under way and wait for it to end, its outcome (an error
    included) consumed: the stop and close paths' background work (a listing, a feed's start,
    the upkeep)."""
    if task is not None:
        task.cancel()  # nothing, if it has ended
        await asyncio.gather(task, return_exceptions=True)


async def until_answered(call: Callable[[], Awaitable[T]], doing: str, within_s: float) -> T:
    """``call()`` (a key-value bucket's write or lookup), made again for up to ``within_s``
    while JetStream's answer is that nobody took it (:func:`._errors.is_transient` and not
    :func:`._errors.maybe_sent`): no responders for a bucket just created (its stream's
    interest not yet known to the server this client talks to, in a cluster), a leader being
    elected. Nothing was stored then, so a retry cannot write twice; a timeout is never
    retried here. The last failure is raised as it is: the caller's bounded call translates
    it."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    delays = backoff(RETRY_FIRST_S, RETRY_CAP_S)
    attempt = 0
    while True:
        attempt += 1
        try:
            return await call()
        except Exception as exc:
            delay = next(delays)
            if (
                not errors.is_transient(exc)
                or errors.maybe_sent(exc)
                or loop.time() + delay >= deadline
            ):
                raise
            logger.debug(
                "NATS: %s: %s; retrying (attempt %d)",
                doing,
                errors.describe(exc),
                attempt,
                extra={"action": "nats_retry"},
            )
        await asyncio.sleep(delay)


async def bounded(aw: Awaitable[T], doing: str, timeout_s: float) -> T:
    """``aw`` (a call off the claim path: a key-value bucket's) within ``timeout_s``, by
    :func:`anarchon.kit.calls.bounded_call`: no answer in time is
    :class:`~anarchon.errors.BackendUnavailable`, a driver's failure of ``doing`` goes through
    :func:`._errors.translate`."""
    return await bounded_call(
        aw,
        where=f"NATS: {doing} failed",
        timeout_s=timeout_s,
        translate=lambda exc: errors.translate(exc, doing),
    )


async def in_flight(
    gate: asyncio.Semaphore,
    limit: int,
    items: Sequence[Item],
    call: Callable[[Item], Awaitable[Answer]],
    answers: dict[int, Answer | Exception] | None = None,
    failed: list[BackendUnavailable] | None = None,
) -> list[Answer | Exception]:
    """``call(item)`` for each item, by at most ``limit`` workers, as many at once as ``gate``
    (shared with other calls, at most ``limit`` wide) lets through, in order: each
    answer, or the exception it raised, in its item's place. Once one raised
    :class:`BackendUnavailable` (the backend is down), the items not started yet get that
    error at once. ``answers``: filled (by item index) as answers come, so that a caller
    cancelled meanwhile still has those decided; ``failed``: the caller's, to stop the items
    not started yet (see :func:`._claims._answered`).

    A few workers take the items in order, rather than a task per item: a burst of 10 000
    claims is then 256 tasks, not 10 000 tasks and their waits at the gate (fewer objects for
    the garbage collector to walk, too)."""
    if answers is None:
        answers = {}
    if failed is None:
        failed = []
    order = iter(range(len(items)))

    async def work() -> None:
        for n in order:
            async with gate:
                if failed:
                    answers[n] = failed[0]
                    continue
                try:
                    answers[n] = await call(items[n])
                except BackendUnavailable as exc:
                    failed.append(exc)
                    answers[n] = exc
                except Exception as exc:
                    answers[n] = exc

    await asyncio.gather(*(work() for _ in range(min(len(items), limit))))
    return [answers[n] for n in range(len(items))]


class Connection:
    """One backend's link to NATS: the client (opened here, or the caller's), its JetStream
    context, and every call the backend makes through it.

    :param owner: how the backend shows itself in messages (its ``repr``).
    :param shown: the server URLs as the caller gave them (credentials included), for messages
        (redacted); ``servers`` by default.
    """

    def __init__(
        self,
        *,
        servers: Sequence[str],
        connect_options: dict[str, Any],
        secrets: Sequence[str],
        given: NATS | None,
        stream: str,
        owner: str,
        shown: Sequence[str] | None = None,
    ) -> None:
        self.servers = list(servers)
        self._shown = list(shown) if shown is not None else self.servers
        """The server URLs as given, for messages (redacted there)."""
        self.given = given
        self.stream = stream
        self._connect_options = connect_options
        self._secrets = list(secrets)
        self._owner = owner
        self.nc: NATS | None = None
        self.js: JetStreamContext | None = None
        self.in_flight: asyncio.Semaphore | None = None
        """The gate that bounds a batch's claims in flight (:data:`MAX_IN_FLIGHT`)."""
        self._acks: Acks | None = None
        self._writer: Writer | None = None
        """What writes publishes and notices into the client's buffer (:meth:`_writer_of`)."""
        self._stream_has_ts: bool | None = None
        self.replicas = 1
        """The stream's replicas, read when it was prepared: a bucket is created with them."""
        self.failures = 0
        """How many calls failed for good (retries spent, or refused): the guard
        (:mod:`._guard`) looks at the stream and buckets soon after it grows."""
        self.buckets_seen: set[str] = set()
        """The key-value buckets this connection found or made: the guard makes them again
        if they are lost."""
        self._down = False
        self._connecting = False
        self._connect_error: Exception | None = None
        self._connect_fatal = asyncio.Event()

    @property
    def started(self) -> bool:
        """True between :meth:`open` and :meth:`close`."""
        return self.nc is not None

    def scrub(self, text: str) -> str:
        """``text`` without any password or token this backend was given."""
        return scrub(text, self._secrets)

    # -- opening and closing ----------------------------------------------------------------

    async def open(self) -> NATS:
        """Connect (unless given a client) and get the JetStream context."""
        nc = self.given if self.given is not None else await self._connect()
        self.nc = nc
        self.js = nc.jetstream(timeout=REQUEST_TIMEOUT_S)
        self.in_flight = asyncio.Semaphore(MAX_IN_FLIGHT)
        return nc

    async def close(self) -> None:
        """Close the client this connection opened; never the caller's."""
        nc, self.nc, self.js = self.nc, None, None
        acks, self._acks = self._acks, None
        self._writer = None
        if acks is not None:  # on a connection you passed in, the subscription is ended here
            await acks.close()
        if nc is not None and nc is not self.given and not nc.is_closed:
            await nc.close()

    async def _connect(self) -> NATS:
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
                connect_timeout=CONNECT_TIMEOUT_S,
                reconnect_time_wait=RECONNECT_WAIT_S,
                max_reconnect_attempts=CONNECT_ATTEMPTS,
                ping_interval=PING_INTERVAL_S,
                max_outstanding_pings=MAX_OUTSTANDING_PINGS,
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
        limit = (CONNECT_TIMEOUT_S + RECONNECT_WAIT_S) * (CONNECT_ATTEMPTS + 1) * len(self.servers)
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
                    f"{errors.describe(cause)}. Check that nats-server runs there, with "
                    "JetStream enabled (nats-server -js), and that the URL, credentials and "
                    "TLS files are right"
                ),
            ) from None
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
            logger.debug("NATS: %s", text, extra={"action": "nats_error"})
        else:
            logger.warning("NATS: %s", text, extra={"action": "nats_error"})

    async def _on_disconnected(self) -> None:
        if self._down or self._connecting or self.nc is None:
            return
        self._down = True
        logger.warning(
            "disconnected from NATS; reconnecting every %.1f s (claims fail closed meanwhile)",
            RECONNECT_WAIT_S,
            extra={"action": "backend_unavailable"},
        )

    async def _on_reconnected(self) -> None:
        self._down = False
        nc = self.nc
        if nc is not None:
            set_read_size(nc)  # a new socket
        url = _where(nc) if nc is not None else "?"
        logger.warning("reconnected to NATS at %s", url, extra={"action": "backend_recovered"})

    # -- the stream -------------------------------------------------------------------------

    async def prepare_stream(
        self, wanted: stream_setup.Wanted, *, read_only: bool
    ) -> dict[str, Any]:
        """Create or evolve the stream (``read_only``: require it, unchanged), retrying while
        the server elects a leader; return its info."""
        if read_only:
            call = partial(stream_setup.require, self.api, self.stream)
        else:
            call = partial(stream_setup.ensure, self.api, self._floored(wanted))
        info = await self._preparing(call)
        self._learn(info)
        return info

    async def recreate_stream(self, wanted: stream_setup.Wanted) -> tuple[dict[str, Any], bool]:
        """Create the stream as :meth:`prepare_stream` creates a new one, unless it exists
        again (then it is left as it is), retrying as that does; its info, and True if this call
        created it."""
        info, made = await self._preparing(
            partial(stream_setup.recreate, self.api, self._floored(wanted))
        )
        self._learn(info)
        return info, made

    def _floored(self, wanted: stream_setup.Wanted) -> stream_setup.Wanted:
        """``wanted``, with a first sequence only where the server takes one: servers before
        2.10 do not (see :func:`._stream.fence_floor`)."""
        nc, _ = self.require()
        return replace(wanted, fence_floor=_server_at_least(nc, 2, 10))

    def _learn(self, info: dict[str, Any]) -> None:
        self._stream_has_ts = "ts" in info
        self.replicas = stream_setup.replicas(info)

    async def _preparing(self, call: Callable[[], Awaitable[T]]) -> T:
        """``call()``, made again while the server elects a leader (for up to
        :data:`START_RETRY_S`); a failure translated, JetStream not enabled explained."""
        nc, _ = self.require()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + START_RETRY_S
        while True:
            try:
                return await call()
            except Exception as exc:
                self._explain_no_jetstream(nc, exc)
                if not errors.is_transient(exc) or loop.time() > deadline:
                    raise errors.translate(exc, f"preparing stream {self.stream!r}") from exc
                await asyncio.sleep(0.25)

    def note_failure(self, exc: BaseException) -> None:
        """Count a call that failed for good with ``exc`` (:attr:`failures`): the stream or a
        bucket it used may be gone. A lookup that found no bucket is not counted: a bucket not
        made yet (the control bucket before the first pause, looked for every second) is no
        loss, and one that was lost is found by the guard's own looks."""
        from nats.js.errors import BucketNotFoundError

        if isinstance(exc, BucketNotFoundError) or isinstance(exc.__cause__, BucketNotFoundError):
            return
        self.failures += 1

    def reconnects(self) -> int:
        """How many times the client has reconnected (0 before it is opened)."""
        nc = self.nc
        return int(nc.stats["reconnects"]) if nc is not None else 0

    def _explain_no_jetstream(self, nc: NATS, exc: Exception) -> None:
        import nats.errors

        no_answer = isinstance(exc, nats.errors.NoRespondersError)
        disabled = isinstance(exc, JetStreamError) and exc.err_code in (
            errors.JETSTREAM_NOT_ENABLED,
            errors.JETSTREAM_NOT_ENABLED_FOR_ACCOUNT,
        )
        server_info: dict[str, Any] = getattr(nc, "_server_info", None) or {}
        if disabled or (no_answer and not server_info.get("jetstream")):
            url = _where(nc)
            raise BackendError(
                f"JetStream is not enabled on the NATS server at {url}: NatsBackend needs it. "
                "Start the server with JetStream enabled (nats-server -js, or a 'jetstream {}' "
                "block in its configuration)"
            ) from exc

    async def stream_info(self) -> dict[str, Any]:
        """The stream's info as the server reports it now (JetStreamError if none)."""
        return await self.api(subjects.API.format(verb="STREAM.INFO", stream=self.stream), None)

    async def bucket_keys(self, bucket: str, start: str) -> list[str]:
        """The keys of key-value bucket ``bucket`` that begin with ``start`` (which ends with a
        dot), read from the bucket's stream info rather than nats-py's ``keys()``: its watcher
        can report an empty bucket before the entries it already holds arrive (nats.py #842).
        A key whose last entry is a delete marker is listed; reading it finds it deleted."""
        prefix = f"$KV.{bucket}."
        found = await self.subjects(f"KV_{bucket}", f"{prefix}{start}>")
        return [subject[len(prefix) :] for subject in found]

    async def purge_keys(self, bucket: str, keys: str, before_seq: int | None = None) -> None:
        """Remove the messages of the keys of key-value bucket ``bucket`` that match ``keys``
        (one key, or a filter ending in ``*`` or ``>``); with ``before_seq``, only those stored
        before that sequence. Unlike a delete, a purge leaves no marker behind."""
        _, js = self.require()
        await js.purge_stream(f"KV_{bucket}", seq=before_seq, subject=f"$KV.{bucket}.{keys}")

    async def delete_key(self, bucket: str, key: str, last: int) -> int | None:
        """Put a delete marker on key ``key`` of key-value bucket ``bucket`` if its last revision
        is still ``last`` (a compare-and-set delete); the marker's sequence, or None when the key
        was written or removed since. nats-py's ``KeyValue.delete`` answers neither: its
        publish's ack is dropped, and a lost compare-and-set raises a generic 400."""
        from nats.js.errors import APIError

        _, js = self.require()
        headers = {"KV-Operation": "DEL", "Nats-Expected-Last-Subject-Sequence": str(last)}
        try:
            ack = await js.publish(f"$KV.{bucket}.{key}", b"", headers=headers)
        except APIError as exc:
            if exc.err_code in errors.WRONG_LAST_SEQUENCE:
                return None
            raise
        return int(ack.seq)

    async def open_bucket(
        self,
        bucket: str,
        *,
        create: bool,
        doing: str,
        bounded: Callable[[Awaitable[Any], str], Awaitable[Any]],
    ) -> KeyValue | None:
        """Key-value bucket ``bucket``; None if it does not exist, unless ``create``: then it
        is made (one revision per key, the stream's replicas; creating one that another instance
        just made is idempotent, and one it made with other settings is used). Each request goes
        through ``bounded(request, what it does)``, the caller's bounded and translated call, and
        is made again while nobody answers it (:func:`until_answered`); ``doing`` says what the
        lookup is for."""
        from nats.js.api import KeyValueConfig
        from nats.js.errors import APIError, BucketNotFoundError

        _, js = self.require()
        within = BUCKET_RETRY_S

        try:
            kv: KeyValue = await bounded(
                until_answered(lambda: js.key_value(bucket), doing, within), doing
            )
            self.buckets_seen.add(bucket)
            return kv
        except BackendError as exc:
            if not isinstance(exc.__cause__, BucketNotFoundError):
                raise
            if not create:
                return None
        config = KeyValueConfig(bucket=bucket, history=1, replicas=self.replicas)
        creating = f"creating key-value bucket {bucket!r}"
        made_here = False

        async def make() -> KeyValue:
            nonlocal made_here
            try:
                created = await until_answered(
                    lambda: js.create_key_value(config), creating, within
                )
                made_here = True
                return created
            except (APIError, JetStreamError) as exc:
                if exc.err_code != errors.STREAM_NAME_IN_USE:
                    raise
            # Made by another instance meanwhile, with other settings (its replicas): use it.
            return await until_answered(lambda: js.key_value(bucket), creating, within)

        made: KeyValue = await bounded(make(), creating)
        if made_here and bucket in self.buckets_seen:
            logger.warning(
                "re-created key-value bucket %s (one revision per key, R%d): it was lost under "
                "this running instance (deleted, or its server lost its store), and what it held "
                "is gone: %s",
                bucket,
                self.replicas,
                bucket_loss(bucket),
                extra={"action": "bucket_recreated", "stream": f"KV_{bucket}"},
            )
        self.buckets_seen.add(bucket)
        return made

    async def subjects(self, stream: str, subjects_filter: str) -> list[str]:
        """The subjects of ``stream`` that match ``subjects_filter`` and hold a message, from
        the stream's info (page by page: the server sends a bounded number at a time)."""
        found: list[str] = []
        while True:
            body = {"subjects_filter": subjects_filter, "offset": len(found)}
            info = await self.api(subjects.API.format(verb="STREAM.INFO", stream=stream), body)
            page = (info.get("state") or {}).get("subjects") or {}
            found.extend(page)
            if not page or len(found) >= int(info.get("total", len(found))):
                return found

    # -- calls ------------------------------------------------------------------------------

    def require(self) -> tuple[NATS, JetStreamContext]:
        """The client and its JetStream context; BackendError if not started."""
        if self.nc is None or self.js is None:
            raise BackendError(f"{self._owner} is not started; start the scheduler first")
        return self.nc, self.js

    @staticmethod
    def first_wait(deadline: float, now: float) -> float:
        """How long the first attempt of a call retried until ``deadline`` waits (as
        :meth:`retry` waits), at event-loop time ``now``."""
        return max(0.25, min(REQUEST_TIMEOUT_S, deadline - now))

    def retry_deadline(self) -> float:
        """Event-loop time until which a call started now is retried (:data:`CLAIM_RETRY_S`)."""
        return asyncio.get_running_loop().time() + CLAIM_RETRY_S

    async def api(
        self, subject: str, body: dict[str, Any] | None, wait_s: float = REQUEST_TIMEOUT_S
    ) -> dict[str, Any]:
        """One JetStream API request with the server's own JSON; errors as JetStreamError."""
        nc, _ = self.require()
        payload = b"" if body is None else json.dumps(body).encode()
        reply = await nc.request(subject, payload, timeout=wait_s)
        try:
            answer = json.loads(reply.data)
        except ValueError as exc:
            raise BackendError(
                f"NATS: unreadable answer to {subject}: {reply.data[:200]!r}"
            ) from exc
        if not isinstance(answer, dict):
            raise BackendError(f"NATS: unexpected answer to {subject}: {reply.data[:200]!r}")
        if "error" in answer:
            raise errors.api_error(answer["error"])
        return answer

    async def retry(
        self,
        call: Callable[[float], Awaitable[T]],
        doing: str,
        deadline: float,
        fields: dict[str, Any] | None = None,
        *,
        failed: Exception | None = None,
    ) -> T:
        """Run ``call(wait_s)`` until it succeeds, retrying transient failures until
        ``deadline`` (event-loop time) or MAX_ATTEMPTS; then raise BackendUnavailable.

        ``failed``: the error of a first attempt the caller already made itself (with
        :meth:`first_wait`), which counts as attempt 1."""
        loop = asyncio.get_running_loop()
        delays = None  # made at the first failure: most calls succeed at once
        attempt = 0
        while True:
            attempt += 1
            try:
                if failed is not None:
                    raise failed
                return await call(max(0.25, min(REQUEST_TIMEOUT_S, deadline - loop.time())))
            except Exception as exc:
                failed = None
                if not errors.is_transient(exc):
                    self.note_failure(exc)
                    raise errors.translate(exc, doing) from exc
                if delays is None:
                    delays = backoff(RETRY_FIRST_S, RETRY_CAP_S)
                delay = next(delays)
                if attempt >= MAX_ATTEMPTS or loop.time() + delay >= deadline:
                    self.note_failure(exc)
                    raise errors.translate(exc, doing) from exc
                logger.debug(
                    "NATS: %s: %s; retrying (attempt %d)",
                    doing,
                    errors.describe(exc),
                    attempt,
                    extra={**(fields or {}), "action": "nats_retry"},
                )
            await asyncio.sleep(delay)

    async def publish(self, subject: str, payload: bytes, msg_id: str | None, wait_s: float) -> Ack:
        """Publish once, with ``msg_id`` as the de-duplication id; InFlight for a duplicate ack
        whose original is not stored yet.

        As nats-py's ``JetStreamContext.publish``, with its errors (no answer in ``wait_s``:
        ``nats.errors.TimeoutError``; nobody listening: ``NoStreamResponseError``; the
        server's error: ``APIError``), but the ack comes to one subscription of this
        connection, by reply subject, handed over raw (:func:`._wire.subscribe_raw`), and waits
        on a plain future under the connection's one timer (:class:`._wire.Acks`); the command
        is written by :class:`._wire.Writer`. About half the client CPU of a request (its
        per-call inbox token and ``wait_for``), which is most of a burst's client CPU.
        """
        nc, _ = self.require()
        acks = self._acks if self._acks is not None and self._acks.nc is nc else None
        if acks is None:
            acks = self._acks = Acks(nc, self._writer_of(nc))
            await acks.listen()
        ack = await acks.publish(subject, payload, msg_id, wait_s)
        if ack.duplicate and not ack.seq:
            raise InFlight()
        return ack

    async def send(self, subject: str, payload: bytes) -> None:
        """A core NATS message (not stored, no answer), written by the connection's
        :class:`._wire.Writer` with the publishes of the same event-loop turn: a claim notice
        after a won claim goes out with the next claim's publish, in one write."""
        nc, _ = self.require()
        writer = self._writer_of(nc)
        if not writer.write(subject, "", payload, None):
            await writer.through_client(subject, "", payload, None)

    def _writer_of(self, nc: NATS) -> Writer:
        """The :class:`._wire.Writer` of ``nc`` (a new one after the client changed)."""
        writer = self._writer
        if writer is None or writer.nc is not nc:
            writer = self._writer = Writer(nc, asyncio.get_running_loop())
        return writer

    async def publish_retrying(
        self, subject: str, payload: bytes, msg_id: str | None, doing: str, deadline: float
    ) -> Ack:
        """:meth:`publish`, retried with the same id until ``deadline``."""
        return await self.retry(
            lambda t: self.publish(subject, payload, msg_id, t), doing, deadline
        )

    async def get(self, request: dict[str, Any], wait_s: float) -> Stored | None:
        """Read one message (by ``seq``, ``last_by_subj`` or ``next_by_subj``) from the stream
        leader; None if there is none."""
        subject = subjects.API.format(verb="STREAM.MSG.GET", stream=self.stream)
        try:
            answer = await self.api(subject, request, wait_s)
        except JetStreamError as exc:
            if exc.err_code == errors.NO_MESSAGE:
                return None
            raise
        message = answer["message"]
        return Stored(
            seq=int(message["seq"]),
            subject=str(message["subject"]),
            time_ms=records.parse_time_ms(str(message["time"])),
            data=base64.b64decode(message.get("data") or ""),
        )

    async def get_retrying(self, request: dict[str, Any], doing: str) -> Stored | None:
        """:meth:`get`, retried for up to :data:`CLAIM_RETRY_S`."""
        return await self.retry(lambda t: self.get(request, t), doing, self.retry_deadline())

    async def read_all(self, filter_subject: str, doing: str) -> list[Stored]:
        """Every message on ``filter_subject``, retried for up to :data:`CLAIM_RETRY_S`."""
        return await self.retry(
            lambda t: self._read_once(self.stream, filter_subject, last_per_subject=False),
            doing,
            self.retry_deadline(),
        )

    async def read_bucket(self, bucket: str, start: str) -> list[tuple[str, Stored]]:
        """The last message of each key of key-value bucket ``bucket`` that begins with
        ``start`` (which ends with a dot), as ``(key, message)``; the message's ``seq`` is the
        key's revision, and a delete marker comes with empty data. One consumer reads them
        all, where nats-py's ``get`` is one request per key."""
        prefix = f"$KV.{bucket}."
        found = await self._read_once(f"KV_{bucket}", f"{prefix}{start}>", last_per_subject=True)
        return [(message.subject[len(prefix) :], message) for message in found]

    async def _read_once(
        self, stream: str, filter_subject: str, *, last_per_subject: bool
    ) -> list[Stored]:
        """Through a short-lived ephemeral pull consumer (one filter: nats-server 2.9 ignores
        multi-subject filters); every message, or only each subject's last."""
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

        _, js = self.require()
        name = f"anarchon_{uuid.uuid4().hex}"
        config = ConsumerConfig(
            name=name,
            ack_policy=AckPolicy.NONE,
            deliver_policy=(
                DeliverPolicy.LAST_PER_SUBJECT if last_per_subject else DeliverPolicy.ALL
            ),
            filter_subject=filter_subject,
            inactive_threshold=CONSUMER_INACTIVE_S,
            mem_storage=True,
        )
        info = await js.add_consumer(stream, config=config)
        try:
            pending = info.num_pending or 0
            if pending == 0:
                return []
            sub = await js.pull_subscribe_bind(consumer=name, stream=stream)
            try:
                return await self._drain(sub, pending)
            finally:
                await sub.unsubscribe()
        finally:
            await self._forget_consumer(stream, name)

    @staticmethod
    async def _drain(sub: JetStreamContext.PullSubscription, pending: int) -> list[Stored]:
        out: list[Stored] = []
        left = pending
        while left > 0 and len(out) < pending:
            batch = await sub.fetch(min(FETCH_BATCH, pending - len(out)), timeout=REQUEST_TIMEOUT_S)
            if not batch:
                break
            for msg in batch:
                fields = records.ack_fields(msg.reply or "")
                if fields is None:
                    continue
                seq, time_ms, left = fields
                out.append(Stored(seq=seq, subject=msg.subject, time_ms=time_ms, data=msg.data))
        return out

    async def _forget_consumer(self, stream: str, name: str) -> None:
        js = self.js
        if js is None:
            return
        try:
            await js.delete_consumer(stream, name)
        except Exception as exc:  # it expires by itself after CONSUMER_INACTIVE_S
            logger.debug("could not delete consumer %s: %s", name, errors.describe(exc))

    # -- the server's clock -----------------------------------------------------------------

    async def server_time_ms(self, probe_subject: str) -> int | None:
        """The stream leader's clock: the ``ts`` of a stream info answer (nats-server 2.10+),
        else the timestamp JetStream stamps on a probe message (deleted right after)."""
        self.require()
        deadline = asyncio.get_running_loop().time() + REQUEST_TIMEOUT_S * 2
        try:
            if self._stream_has_ts is not False:
                info = await self.retry(
                    lambda t: self.api(
                        subjects.API.format(verb="STREAM.INFO", stream=self.stream), None, t
                    ),
                    "reading the server's clock",
                    deadline,
                )
                if "ts" in info:
                    self._stream_has_ts = True
                    return records.parse_time_ms(str(info["ts"]))
                self._stream_has_ts = False
            return await self._probe_clock(probe_subject, deadline)
        except BackendUnavailable:
            raise
        except BackendError as exc:
            logger.warning("cannot read the NATS server's clock: %s", exc)
            return None

    async def _probe_clock(self, subject: str, deadline: float) -> int | None:
        ack = await self.publish_retrying(
            subject, b"", None, "probing the server's clock", deadline
        )
        stored = await self.get_retrying({"seq": ack.seq}, "reading the clock probe")
        try:
            await self.api(
                subjects.API.format(verb="STREAM.MSG.DELETE", stream=self.stream),
                {"seq": ack.seq, "no_erase": True},
            )
        except Exception as exc:  # bounded anyway by the per-subject limit
            logger.debug("could not delete clock probe %d: %s", ack.seq, errors.describe(exc))
        return stored.time_ms if stored is not None else None
