"""The NATS client calls: every request bounded, retried on transient failures and translated
into anarchon's errors.

Everything that talks to nats-py goes through :class:`Connection`: JetStream API requests (the
server's own JSON), publishes with a message id, reads of one stored message, reads of many
through a short-lived consumer (:mod:`._reads`), preparing the stream, and the server's clock.
The rest of the package decides what to ask; this module decides how long to wait (the durations
are in :mod:`._timings`), when to retry and what a failure means. Opening the client and hearing
of its outages is :mod:`._client`; the key-value buckets are :mod:`._buckets`; how a publish and
its ack travel, past nats-py's own publish and subscription paths, is in :mod:`._wire`.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any, Final, TypeVar

from ...errors import BackendError, BackendUnavailable
from ...kit import Action, log_fields
from ...kit.calls import bounded_call, cancel_and_wait, retrying
from . import _errors as errors
from . import _records as records
from . import _stream as stream_setup
from . import _subjects as subjects
from . import _timings as timings
from ._client import Opener, close_client, server_at_least, where
from ._errors import InFlight, JetStreamError
from ._options import scrub
from ._reads import read_through_consumer
from ._records import Stored
from ._wire import Ack, Acks, Writer

if TYPE_CHECKING:
    from nats.aio.client import Client as NATS
    from nats.js import JetStreamContext

logger = logging.getLogger("anarchon.backends.nats")

T = TypeVar("T")
Item = TypeVar("Item")
Answer = TypeVar("Answer")

# Claims of one batch in flight at once: enough to fill the pipe, bounded so a batch of
# thousands does not overflow nats-py's reconnect buffer.
MAX_IN_FLIGHT: Final = 256


async def cancel_unfinished(task: asyncio.Future[Any] | None) -> None:
    """Cancel ``task`` if it is still under way and wait for it to end, its outcome consumed (an
    error logged, not raised): the stop and close paths' background work (a listing, a feed's
    start, the upkeep, the guard).

    Cancelled again while it runs on, for at most a few seconds
    (:func:`anarchon.kit.calls.cancel_and_wait`): nats-py's request waits for its answer in
    ``asyncio.wait_for``, which on Python 3.11 swallows a cancellation that comes in the
    event-loop turn its answer is read (it returns the answer instead), and a loop whose one
    cancellation was swallowed runs on for ever (a stop() that waited for it never returned).
    A task that outlives that bound is left behind, logged (on this backend's logger)."""
    if task is None:
        return
    await cancel_and_wait([task], logger=logger)


async def within(aw: Awaitable[None], limit_s: float, doing: str) -> None:
    """Await ``aw``, a step of a stop, for at most ``limit_s``; past it the step is cancelled
    (:func:`cancel_unfinished`) and the stop goes on, logged. Its error is raised.

    A stop must end whatever the server does: an unsubscribe waits for room in nats-py's
    queue of writes, which a server that stopped reading never makes."""
    task = asyncio.ensure_future(aw)
    try:
        done, _ = await asyncio.wait({task}, timeout=limit_s)
    except BaseException:  # the stop itself was cancelled: so is its step
        task.cancel()
        raise
    if not done:
        logger.warning(
            "NATS: %s did not finish within %.0f s; stopping without it",
            doing,
            limit_s,
            extra=log_fields(Action.BACKEND_UNAVAILABLE),
        )
        await cancel_unfinished(task)
        return
    task.result()


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


def retry_logger(
    doing: str, fields: dict[str, Any] | None = None
) -> Callable[[Exception, int], None]:
    """The ``on_retry`` of a NATS call retried by :func:`anarchon.kit.calls.retrying`: a debug
    line per retry (``nats_retry``, with ``fields``), naming what failed and the attempt."""

    def log(exc: Exception, attempt: int) -> None:
        logger.debug(
            "NATS: %s: %s; retrying (attempt %d)",
            doing,
            errors.describe(exc),
            attempt,
            extra={**(fields or {}), **log_fields(Action.NATS_RETRY)},
        )

    return log


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
    """One backend's link to NATS: the client (the caller's, or one its :class:`._client.Opener`
    connects), its JetStream context, and every call the backend makes through it.

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
        self.given = given
        self.stream = stream
        self._secrets = list(secrets)
        self._owner = owner
        self._opener = Opener(
            servers=self.servers,
            shown=list(shown) if shown is not None else self.servers,
            connect_options=connect_options,
            scrub=self.scrub,
            current=lambda: self.nc,
        )
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
        nc = self.given if self.given is not None else await self._opener.connect()
        self.nc = nc
        self.js = nc.jetstream(timeout=timings.REQUEST_TIMEOUT_S)
        self.in_flight = asyncio.Semaphore(MAX_IN_FLIGHT)
        return nc

    async def close(self) -> None:
        """Close the client this connection opened; never the caller's."""
        nc, self.nc, self.js = self.nc, None, None
        acks, self._acks = self._acks, None
        self._writer = None
        if acks is not None:  # on a connection you passed in, the subscription is ended here
            await within(
                acks.close(), timings.ACKS_CLOSE_S, "ending the subscription to publish acks"
            )
        if nc is not None and nc is not self.given and not nc.is_closed:
            await close_client(nc)

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
        return replace(wanted, fence_floor=server_at_least(nc, 2, 10))

    def _learn(self, info: dict[str, Any]) -> None:
        self._stream_has_ts = "ts" in info
        self.replicas = stream_setup.replicas(info)

    async def _preparing(self, call: Callable[[], Awaitable[T]]) -> T:
        """``call()``, made again while the server elects a leader (for up to
        :data:`._timings.START_RETRY_S`); a failure translated, JetStream not enabled explained."""
        nc, _ = self.require()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timings.START_RETRY_S
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
            url = where(nc)
            raise BackendError(
                f"JetStream is not enabled on the NATS server at {url}: NatsBackend needs it. "
                "Start the server with JetStream enabled (nats-server -js, or a 'jetstream {}' "
                "block in its configuration)"
            ) from exc

    async def stream_info(self) -> dict[str, Any]:
        """The stream's info as the server reports it now (JetStreamError if none)."""
        return await self.api(subjects.API.format(verb="STREAM.INFO", stream=self.stream), None)

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
        return max(0.25, min(timings.REQUEST_TIMEOUT_S, deadline - now))

    def retry_deadline(self) -> float:
        """Event-loop time until which a call started now is retried
        (:data:`._timings.CLAIM_RETRY_S`)."""
        return asyncio.get_running_loop().time() + timings.CLAIM_RETRY_S

    async def api(
        self, subject: str, body: dict[str, Any] | None, wait_s: float = timings.REQUEST_TIMEOUT_S
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

        The loop is the kit's (:func:`anarchon.kit.calls.retrying`); this names NATS's part:
        the transient test, each attempt's wait (:meth:`first_wait`), the log of each retry
        and the translation of the last failure. ``failed``: the error of a first attempt the
        caller already made itself (with :meth:`first_wait`), which counts as attempt 1."""
        loop = asyncio.get_running_loop()
        try:
            return await retrying(
                lambda: call(self.first_wait(deadline, loop.time())),
                is_transient=errors.is_transient,
                deadline_s=max(0.0, deadline - loop.time()),
                first_s=timings.RETRY_FIRST_S,
                cap_s=timings.RETRY_CAP_S,
                max_attempts=timings.MAX_ATTEMPTS,
                failed=failed,
                on_retry=retry_logger(doing, fields),
            )
        except Exception as exc:
            self.note_failure(exc)
            raise errors.translate(exc, doing) from exc

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
        """:meth:`get`, retried for up to :data:`._timings.CLAIM_RETRY_S`."""
        return await self.retry(lambda t: self.get(request, t), doing, self.retry_deadline())

    async def read_all(self, filter_subject: str, doing: str) -> list[Stored]:
        """Every message on ``filter_subject``, retried for up to
        :data:`._timings.CLAIM_RETRY_S`."""
        return await self.retry(
            lambda t: read_through_consumer(
                self,
                self.stream,
                filter_subject,
                last_per_subject=False,
                fetch_wait_s=timings.REQUEST_TIMEOUT_S,
            ),
            doing,
            self.retry_deadline(),
        )

    # -- the server's clock -----------------------------------------------------------------

    async def server_time_ms(self, probe_subject: str) -> int | None:
        """The stream leader's clock: the ``ts`` of a stream info answer (nats-server 2.10+),
        else the timestamp JetStream stamps on a probe message (deleted right after)."""
        self.require()
        deadline = asyncio.get_running_loop().time() + timings.REQUEST_TIMEOUT_S * 2
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
