"""The raw wire paths: publishes written straight into nats-py's buffer, and messages handed to
their handler as nats-py's parser reads them, for the claim path's speed.

:class:`Writer` builds a ``PUB``/``HPUB`` command in one step and writes a turn's commands in one
callback; :class:`Acks` waits for the publish acks of a connection on one subscription and one
timer; :func:`subscribe_raw` hands a subscription's messages over before nats-py parses them
(:class:`_RawDispatch`); :func:`subscribe_sink` hands parsed messages over in the read loop
(:class:`Sink`). :class:`._connection.Connection` publishes through :class:`Writer` and
:class:`Acks`; the claim notices (:mod:`._backend`) and the read-back consumer
(:mod:`._readback`) subscribe raw, the pause watch (:mod:`._control`) through a sink.

They rely on nats-py's client internals, as nats-py 2.9 to 2.16 have them: the parser's call of
``Client._process_msg(sid, subject, reply, data, headers)`` (replaced, per client, by a
:class:`_RawDispatch`), the pending-command buffer (``_pending``, ``_pending_data_size``), the
connection state (``_status`` against ``Client.CONNECTED``), ``_transport``, ``_max_payload``,
``stats`` and a subscription's ``_id``. :func:`raw_ready` turns the raw paths off for a client
the backend did not open itself (:data:`OPENED`: never a caller's) or whose class lacks those
internals (checked once per class): :class:`Writer` then refuses every write (the caller
publishes through nats-py's ``publish``) and :func:`subscribe_raw` subscribes through
:class:`Sink`, rebuilding the raw arguments from nats-py's parsed message. :class:`Sink` is used
on every client: it needs only ``subscribe``'s ``future=`` argument, whose ``set_result`` nats-py
calls with each message in its read loop.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import math
import re
import weakref
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final, NamedTuple, cast

from . import _errors as errors
from . import _records as records
from . import _subjects as subjects
from . import _timings as timings

if TYPE_CHECKING:
    from nats.aio.client import Client as NATS

logger = logging.getLogger("anarchon.backends.nats")


class Ack(NamedTuple):
    """A JetStream publish ack: what the backend reads of it (nats-py's ``PubAck`` costs a
    ``dataclasses.fields()`` walk per ack)."""

    stream: str
    seq: int
    duplicate: bool


class Sink:
    """Hands each message of a subscription to ``handle`` as nats-py reads it.

    nats-py gives a subscription made with ``cb=`` its messages through a queue and a task of
    the subscription's own: an event-loop turn, a queue put and get and a task step per message
    before the callback runs. A subscription made with ``future=`` gets each message by
    ``future.set_result(msg)`` in the client's read loop instead (the path of nats-py's
    one-shot requests), so this object stands in for that future: every message goes to
    ``handle`` at once, in order. ``handle`` must not block; what it raises is logged, never
    let into nats-py's read loop.
    """

    __slots__ = ("_handle",)

    def __init__(self, handle: Callable[[Any], None]) -> None:
        self._handle = handle

    def cancelled(self) -> bool:
        return False

    def set_result(self, msg: Any) -> None:
        try:
            self._handle(msg)
        except Exception as exc:
            logger.debug("NATS: a message on %s was not handled: %s", msg.subject, exc)


async def subscribe_sink(nc: NATS, subject: str, handle: Callable[[Any], None]) -> Any:
    """Subscribe to ``subject``, each message handed to ``handle`` in nats-py's read loop
    (:class:`Sink`); the subscription, to unsubscribe."""
    return await nc.subscribe(subject, future=cast(Any, Sink(handle)))


#: A raw handler: ``(subject, reply, data, headers)`` as nats-py's parser hands them over, all
#: bytes (``headers``: the raw header block, None when the message has none).
RawHandler = Callable[[bytes, bytes, bytes, "bytes | None"], None]


class _RawDispatch:
    """Stands in for a client's ``_process_msg`` (the parser calls it for every message):
    messages of the subscriptions in ``table`` go to their :data:`RawHandler` as the parser
    hands them over, every other message to nats-py as before.

    nats-py's own handling of a message parses its headers into a dict, builds a ``Msg`` and
    decodes its subjects, all before a subscriber sees it: a claims-feed message (it carries
    the claim's ``Nats-Msg-Id``) cost more there than in the handler that reads it."""

    __slots__ = ("_done", "_process_msg", "table")

    def __init__(self, process_msg: Callable[..., Awaitable[None]]) -> None:
        self.table: dict[int, RawHandler] = {}
        self._process_msg = process_msg
        # What the parser awaits after a raw message: a future that is already done, so the
        # await returns at once with no coroutine made and run for the message.
        self._done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._done.set_result(None)

    def __call__(
        self, sid: int, subject: bytes, reply: bytes, data: bytes, headers: bytes | None
    ) -> Awaitable[None]:
        handle = self.table.get(sid)
        if handle is None:
            return self._process_msg(sid, subject, reply, data, headers)
        try:
            handle(subject, reply, data, headers)
        except Exception as exc:
            logger.debug("NATS: a message on %r was not handled: %s", subject, exc)
        return self._done


def _dispatch(nc: NATS) -> _RawDispatch:
    """The client's :class:`_RawDispatch`, put in place at its first raw subscription."""
    current = vars(nc).get("_process_msg")
    if isinstance(current, _RawDispatch):
        return current
    dispatch = _RawDispatch(nc._process_msg)
    nc._process_msg = dispatch  # type: ignore[method-assign,assignment]
    return dispatch


#: The clients the backend opened itself (:class:`._connection.Connection` adds each one it
#: connects): only theirs take the raw paths (:func:`raw_ready`);
#: a client the caller passed in is used through nats-py's public calls alone.
OPENED: weakref.WeakSet[Any] = weakref.WeakSet()
#: nats-py's client internals the raw paths use, as nats-py 2.9 to 2.16 have them.
_PROCESS_MSG_PARAMS: Final = ("self", "sid", "subject", "reply", "data", "headers")
_CLIENT_ATTRIBUTES: Final = ("_pending", "_pending_data_size", "_status", "_transport")
_known_clients: dict[type, bool] = {}


def raw_ready(nc: NATS) -> bool:
    """True if the raw paths (:func:`subscribe_raw`, :class:`Writer`) may be used on ``nc``:
    the backend opened it (never a caller's client) and its class has the internals they use
    (checked once per class; another nats-py keeps to its public calls)."""
    if nc not in OPENED:
        return False
    kind = type(nc)
    known = _known_clients.get(kind)
    if known is None:
        import inspect

        try:
            params = tuple(inspect.signature(kind._process_msg).parameters)
        except (AttributeError, TypeError, ValueError):
            params = ()
        known = _known_clients[kind] = (
            params == _PROCESS_MSG_PARAMS
            and isinstance(getattr(kind, "CONNECTED", None), int)
            and all(hasattr(nc, name) for name in _CLIENT_ATTRIBUTES)
            and isinstance(getattr(nc, "_max_payload", None), int)
        )
        if not known:
            logger.debug("NATS: this nats-py's client internals differ; raw paths not used")
    return known


def _raw_headers(headers: dict[str, str] | None) -> bytes | None:
    """A header block as the server sent it, from nats-py's parsed ``Msg.headers`` (its
    status line's code and text are kept there as ``Status`` and ``Description``)."""
    if not headers:
        return None
    status = " ".join(v for v in (headers.get("Status"), headers.get("Description")) if v)
    lines = [f"NATS/1.0 {status}".rstrip()]
    lines += [f"{k}: {v}" for k, v in headers.items() if k not in ("Status", "Description")]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


class RawSubscription:
    """A subscription whose messages go to a :data:`RawHandler` (:func:`subscribe_raw`)."""

    __slots__ = ("_dispatch", "sub")

    def __init__(self, sub: Any, dispatch: _RawDispatch | None) -> None:
        self.sub, self._dispatch = sub, dispatch

    async def unsubscribe(self) -> None:
        if self._dispatch is not None:
            self._dispatch.table.pop(self.sub._id, None)
        await self.sub.unsubscribe()


async def subscribe_raw(nc: NATS, subject: str, handle: RawHandler) -> RawSubscription:
    """Subscribe to ``subject``, each message handed to ``handle`` raw, in nats-py's read loop
    before nats-py parses it (:class:`_RawDispatch`). ``handle`` must not block; what it raises
    is logged, never let into the read loop. The subscription is nats-py's (the client makes
    it again after a reconnect, with the same id); its messages never reach its ``Sink``.
    On a client :func:`raw_ready` refuses, each message is handed over from nats-py's parsed
    message instead (the same arguments, rebuilt)."""
    if not raw_ready(nc):

        def parsed(msg: Any) -> None:
            handle(msg.subject.encode(), msg.reply.encode(), msg.data, _raw_headers(msg.headers))

        return RawSubscription(await subscribe_sink(nc, subject, parsed), None)
    dispatch = _dispatch(nc)
    sub = await nc.subscribe(subject, future=cast(Any, Sink(lambda msg: None)))
    dispatch.table[sub._id] = handle
    return RawSubscription(sub, dispatch)


_UNSAFE: Final = re.compile(r"[ \t\r\n]")


class Writer:
    """Publishes of one connection written as nats-py writes them (``PUB``/``HPUB``, added to
    its buffer of pending commands), and the buffer written to the socket by one callback per
    event-loop turn instead of nats-py's flusher task.

    nats-py's ``publish`` validates the subjects with regular expressions, builds the header
    block key by key, and wakes its flusher through a queue and a future: an event-loop turn of
    a task per publish. Here the command is built in one step and the buffer goes out at the
    end of the turn, all publishes of the turn together, as the flusher would send them. What
    this path does not handle goes through nats-py's ``publish`` (a client :func:`raw_ready`
    refuses: the caller's, or another nats-py's; the client not connected or draining, a
    payload over the server's limit, a subject or id with white space)."""

    __slots__ = ("_connected", "_loop", "_scheduled", "nc")

    def __init__(self, nc: NATS, loop: asyncio.AbstractEventLoop) -> None:
        self.nc = nc
        self._loop = loop
        self._scheduled = False
        # A client raw_ready refuses never matches: every publish goes through nats-py's.
        self._connected = type(nc).CONNECTED if raw_ready(nc) else None

    def write(self, subject: str, reply: str, payload: bytes, msg_id: str | None) -> bool:
        """Add the publish's command to nats-py's buffer, sent at the end of the turn; False
        (nothing done) where this path does not go (see the class): the caller then publishes
        by :meth:`through_client`. No coroutine: a claim's publish awaits only its ack."""
        nc = self.nc
        if (
            self._connected is None
            or nc._status != self._connected
            or len(payload) > nc._max_payload
            or _UNSAFE.search(subject) is not None
            or (msg_id is not None and _UNSAFE.search(msg_id) is not None)
        ):
            return False
        if msg_id is None:
            cmd = b"PUB %s %s%d\r\n%s\r\n" % (
                subject.encode(),
                reply.encode() + b" " if reply else b"",
                len(payload),
                payload,
            )
        else:
            header = b"NATS/1.0\r\nNats-Msg-Id: %s\r\n\r\n" % msg_id.encode()
            cmd = b"HPUB %s %s %d %d\r\n%s%s\r\n" % (
                subject.encode(),
                reply.encode(),
                len(header),
                len(header) + len(payload),
                header,
                payload,
            )
        nc._pending.append(cmd)
        nc._pending_data_size += len(cmd)
        stats = nc.stats
        stats["out_msgs"] += 1
        stats["out_bytes"] += len(payload)
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self._flush)
        return True

    async def through_client(
        self, subject: str, reply: str, payload: bytes, msg_id: str | None
    ) -> None:
        """The publish :meth:`write` refused, by nats-py's ``publish``."""
        headers = {subjects.MSG_ID: msg_id} if msg_id is not None else None
        await self.nc.publish(subject, payload, reply=reply, headers=headers)

    def _flush(self) -> None:
        """Write what is pending (as nats-py's flusher does), unless the client lost its
        connection meanwhile: then nats-py keeps it for the next one, or drops it."""
        self._scheduled = False
        nc = self.nc
        if nc._status != self._connected or not nc._pending or nc._transport is None:
            return
        pending, nc._pending = nc._pending, []
        nc._pending_data_size = 0
        try:
            nc._transport.writelines(pending)
        except Exception as exc:  # as the flusher: the read loop sees the connection fail
            logger.debug("NATS: writing publishes failed: %s", errors.describe(exc))


class Acks:
    """Publish acks of one connection, received by one subscription (``<inbox>.<n>``).

    Each publish waits on a plain future. Its time limit is not a timer of its own (a timer handle
    pushed into the event loop's heap, cancelled once the ack came): every publish adds ``(deadline,
    n)`` to a heap of this connection's, and one timer, at the earliest deadline plus
    :data:`._timings.EXPIRY_TICK_S`, fails those whose deadline passed. A publish is failed between
    its wait and :data:`._timings.EXPIRY_TICK_S` after it."""

    def __init__(self, nc: NATS, writer: Writer) -> None:
        self.nc = nc
        self._loop = asyncio.get_running_loop()
        self._writer = writer
        self._prefix = nc.new_inbox() + "."
        self._skip = len(self._prefix)
        self._count = 0
        self._waiting: dict[int, asyncio.Future[Ack]] = {}
        self._deadlines: list[tuple[float, int]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf
        self._sub: RawSubscription | None = None

    async def listen(self) -> None:
        self._sub = await subscribe_raw(self.nc, self._prefix + "*", self._heard)

    async def close(self) -> None:
        import nats.errors

        if self._timer is not None:
            self._timer.cancel()
            self._timer, self._timer_at = None, math.inf
        waiting, self._waiting = self._waiting, {}
        self._deadlines.clear()
        for future in waiting.values():
            if not future.done():  # as a request on a closed connection would
                future.set_exception(nats.errors.ConnectionClosedError())
        sub, self._sub = self._sub, None
        if sub is not None:
            try:
                await sub.unsubscribe()
            except Exception as exc:  # the connection is closed already
                logger.debug("NATS: %s", errors.describe(exc))

    async def publish(self, subject: str, payload: bytes, msg_id: str | None, wait_s: float) -> Ack:
        self._count += 1
        n = self._count
        loop = self._loop
        future: asyncio.Future[Ack] = loop.create_future()
        waiting = self._waiting
        waiting[n] = future
        at = loop.time() + wait_s
        heapq.heappush(self._deadlines, (at, n))
        if at < self._timer_at:
            self._arm(at)
        try:
            writer = self._writer
            reply = f"{self._prefix}{n}"
            if not writer.write(subject, reply, payload, msg_id):
                await writer.through_client(subject, reply, payload, msg_id)
            return await future
        except TimeoutError:
            import nats.errors

            raise nats.errors.TimeoutError from None
        finally:
            waiting.pop(n, None)
            if not waiting:
                self._deadlines.clear()  # all answered: nothing left to fail

    def _arm(self, at: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = at
        self._timer = self._loop.call_at(at + timings.EXPIRY_TICK_S, self._expire)

    def _expire(self) -> None:
        """Fail every publish whose deadline passed; wake again for the next one."""
        self._timer, self._timer_at = None, math.inf
        now = self._loop.time()
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] <= now:
            _, n = heapq.heappop(deadlines)
            future = self._waiting.pop(n, None)
            if future is not None and not future.done():
                future.set_exception(TimeoutError())
        if deadlines:
            self._arm(deadlines[0][0])

    def _heard(self, subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        future = self._waiting.pop(int(subject[self._skip :]), None)
        if future is None or future.done():
            return
        try:
            future.set_result(_pub_ack(data, headers))
        except Exception as exc:
            future.set_exception(exc)


def _pub_ack(data: bytes, headers: bytes | None) -> Ack:
    """The ack in ``data``, or the error nats-py's JetStream publish raises for it."""
    if not data:
        import nats.js.errors

        if headers is not None and headers.startswith(b"NATS/1.0 503"):
            raise nats.js.errors.NoStreamResponseError
    answer = records.load_json(data)
    if "error" in answer:
        import nats.js.errors

        raise nats.js.errors.APIError.from_error(answer["error"])
    return Ack(str(answer.get("stream", "")), int(answer["seq"]), bool(answer.get("duplicate")))
