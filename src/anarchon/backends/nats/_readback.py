"""The read-back of losing claims, from a feed of the stream's claims instead of a request each.

The seed settles a duplicate ack by reading the stored message the ack points at and comparing
tokens. Read by sequence, that is a second round trip for every losing claim: with every
instance claiming at once (no rank delays), two of three claims pay it, and their batch waits
for it. So once this instance gets a duplicate ack, it keeps an ephemeral push consumer on
``<prefix>*.claims`` (:data:`~._subjects.ALL_CLAIMS`), from a little before that sequence on:
JetStream delivers each stored claim once, with its stream sequence and timestamp, and a later
duplicate ack is settled from what arrived. That is still the stored message, read from the
stream, and the tokens are compared as before; only the request is gone.

The feed is an optimisation and never the only source: a sequence it has not delivered within
:data:`._timings.FEED_WAIT_S` (one before the feed began, a feed that lost messages on a reconnect
or was deleted, a claim already trimmed), or within :data:`._timings.FEED_WAIT_MAX_S` while the feed
delivers but lags behind, is read by sequence as before, and a feed that delivered nothing for
:data:`._timings.FEED_WAIT_S` is started again. It stops after :data:`._timings.FEED_IDLE_S` without
a duplicate ack, so a healthy fleet whose rank delays keep the losers from claiming pays nothing for
it.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import math
from typing import Any, Final

from ...kit import Action, log_fields
from . import _errors as errors
from . import _records as records
from . import _subjects as subjects
from . import _timings as timings
from ._connection import MAX_IN_FLIGHT, Connection, cancel_unfinished
from ._records import Stored
from ._wire import RawSubscription, subscribe_raw

logger = logging.getLogger("anarchon.backends.nats")

#: Delivered claims kept for a read at most (a read takes its claim out); the oldest go first.
#: This instance's own wins (:meth:`ReadBack.mine`) are not kept: nobody reads them back. A
#: read follows its claim's delivery by the claims in flight, or by a whole batch when this
#: instance lags behind the others (4 096, under a second of a 5 000-slot burst, sent 62 % of
#: the reads by sequence at 3 x 5 000 every-second jobs); about 8 MB at most.
FEED_KEEP: Final = 16_384
#: Own wins noted for the feed to pass over at most; past that, the noted ones the feed has
#: passed (never delivered) are forgotten.
OWN_KEEP: Final = 65_536
#: The feed starts this many sequences before the duplicate ack that starts it: the other claims
#: of the same batch in flight were stored around it.
FEED_BEFORE: Final = MAX_IN_FLIGHT


class ReadBack:
    """The claims stream's feed of one backend, and reads of the claims it delivered."""

    def __init__(self, connection: Connection, prefix: str) -> None:
        self._connection = connection
        self._prefix = prefix
        self._kept: dict[int, Stored] = {}
        self._waiting: dict[int, list[asyncio.Future[Stored | None]]] = {}
        self._heap: list[int] = []  # the sequences in _waiting, smallest first
        self._sub: RawSubscription | None = None
        self._consumer: str | None = None
        self._generation = 0
        self._first = 0  # the first sequence the running feed delivers
        self._last = 0  # the last sequence it delivered
        self._used = -math.inf  # loop time of the last read
        self._started = -math.inf  # loop time of the last start
        self._starting: asyncio.Future[None] | None = None
        self._answers: set[asyncio.Future[None]] = set()  # flow-control answers being sent
        self._own: set[int] = set()  # sequences of this instance's own first-ack wins

    @property
    def running(self) -> bool:
        """True while a feed is subscribed."""
        return self._sub is not None

    def take(self, seq: int) -> Stored | None:
        """The stored message at ``seq`` if the feed delivered it already (most duplicate acks
        of a race come after their claim's delivery), with no coroutine; else None, and
        :meth:`wait` waits for it."""
        kept = self._kept.pop(seq, None)
        if kept is not None:
            self._used = asyncio.get_running_loop().time()
        return kept

    def mine(self, seq: int) -> None:
        """``seq`` is a claim this instance won on its ack: the feed need not keep it (it may
        have delivered it already: the ack and the delivery race)."""
        if self._sub is None:
            return
        if seq <= self._last:
            self._kept.pop(seq, None)
            return
        own = self._own
        if len(own) >= OWN_KEEP:
            last = self._last
            own.difference_update([s for s in own if s <= last])
            if len(own) >= OWN_KEEP:
                return
        own.add(seq)

    async def wait(self, seq: int) -> Stored | None:
        """The stored message at ``seq``, not delivered yet (:meth:`take` found nothing), if
        the feed delivers it in time (see the module's docstring); None when the caller must
        read it by sequence."""
        loop = asyncio.get_running_loop()
        self._used = loop.time()
        if self._sub is None:
            self._start_soon(seq)
            return None
        if seq < self._first or seq <= self._last:
            return None  # before the feed began, or passed over (trimmed, deleted, or lost)
        waiter: asyncio.Future[Stored | None] = loop.create_future()
        if seq not in self._waiting:
            self._waiting[seq] = []
            heapq.heappush(self._heap, seq)
        self._waiting[seq].append(waiter)
        waited = 0.0
        while True:
            mark = self._last
            done, _ = await asyncio.wait({waiter}, timeout=timings.FEED_WAIT_S)
            if done:
                return waiter.result()
            waited += timings.FEED_WAIT_S
            # A feed that delivers, only behind (a burst of thousands), is waited for a while.
            if self._last == mark or waited >= timings.FEED_WAIT_MAX_S or self._sub is None:
                break
        waiter.cancel()
        stalled = self._last == mark
        logger.debug(
            "the claims feed of stream %s did not deliver seq %d in %.1f s (%s at %d)",
            self._connection.stream,
            seq,
            waited,
            "stalled" if stalled else "behind",
            self._last,
            extra=log_fields(Action.CLAIMS_FEED, state="stalled" if stalled else "behind"),
        )
        if stalled:
            self._start_soon(seq, again=True)
        return None

    def _start_soon(self, seq: int, *, again: bool = False) -> None:
        if self._starting is not None and not self._starting.done():
            return
        loop = asyncio.get_running_loop()
        if loop.time() - self._started < timings.FEED_RESTART_S:
            return
        if again or self._sub is None:
            self._started = loop.time()
            self._starting = asyncio.ensure_future(self._start(max(1, seq - FEED_BEFORE)))

    async def _start(self, first: int) -> None:
        try:
            await self._subscribe(first)
        except Exception as exc:
            logger.debug(
                "no claims feed on stream %s (duplicate acks are read by sequence): %s",
                self._connection.stream,
                errors.describe(exc),
                extra=log_fields(Action.CLAIMS_FEED, state="failed"),
            )

    async def _subscribe(self, first: int) -> None:
        await self.stop()
        nc, _ = self._connection.require()
        stream = self._connection.stream
        self._generation += 1
        generation = self._generation
        inbox = nc.new_inbox()

        def heard(subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
            if generation == self._generation:
                self._heard(subject, reply, data)

        self._first, self._last = first, first - 1
        sub = await subscribe_raw(nc, inbox, heard)
        config = {
            "deliver_subject": inbox,
            "deliver_policy": "by_start_sequence",
            "opt_start_seq": first,
            "ack_policy": "none",
            "replay_policy": "instant",
            "filter_subject": subjects.ALL_CLAIMS.format(prefix=self._prefix),
            "flow_control": True,
            "idle_heartbeat": timings.HEARTBEAT_NS,
            "inactive_threshold": timings.INACTIVE_NS,
            "mem_storage": True,
        }
        try:
            answer = await self._connection.api(
                subjects.API.format(verb="CONSUMER.CREATE", stream=stream),
                {"stream_name": stream, "config": config},
            )
        except BaseException:
            await _quietly(sub.unsubscribe())
            raise
        if generation != self._generation:  # stopped meanwhile
            await _quietly(sub.unsubscribe())
            await self._delete(str(answer.get("name") or ""))
            return
        self._sub, self._consumer = sub, str(answer.get("name") or "")

    def _heard(self, subject: bytes, raw_reply: bytes, data: bytes) -> None:
        """One delivered message, raw, in nats-py's read loop (``subscribe_raw``)."""
        fields = records.ack_fields(raw_reply)
        if fields is None:
            if raw_reply:  # flow control: the server waits for this answer before sending more
                nc = self._connection.nc
                if nc is not None:
                    answer = asyncio.ensure_future(_quietly(nc.publish(raw_reply.decode(), b"")))
                    self._answers.add(answer)  # kept until sent: the loop holds tasks weakly
                    answer.add_done_callback(self._answers.discard)
            return  # an idle heartbeat
        seq, time_ms, _ = fields
        if seq <= self._last:
            return
        self._last = seq
        stored = records.new_stored(seq, subject.decode(), time_ms, data)
        waiters = self._waiting.pop(seq, None)
        if waiters is not None:
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(stored)
        elif self._own and seq in self._own:
            self._own.discard(seq)
        else:
            kept = self._kept
            kept[seq] = stored
            if len(kept) > FEED_KEEP:
                del kept[next(iter(kept))]
        heap = self._heap
        while heap and heap[0] <= seq:  # passed over: not delivered, read by sequence
            self._wake(heapq.heappop(heap))

    def _wake(self, seq: int) -> None:
        for waiter in self._waiting.pop(seq, ()):
            if not waiter.done():
                waiter.set_result(None)

    async def upkeep(self) -> None:
        """Stop the feed after :data:`._timings.FEED_IDLE_S` without a read."""
        if (
            self._sub is not None
            and asyncio.get_running_loop().time() - self._used > timings.FEED_IDLE_S
        ):
            logger.debug(
                "claims feed of stream %s stopped: no duplicate ack for %.0f s",
                self._connection.stream,
                timings.FEED_IDLE_S,
                extra=log_fields(Action.CLAIMS_FEED, state="stopped"),
            )
            await self.stop()
            self._started = -math.inf  # the next duplicate ack starts it again at once

    async def stop(self) -> None:
        """Stop the feed (unsubscribe, delete its consumer) and let every waiting read go."""
        self._generation += 1
        sub, self._sub = self._sub, None
        consumer, self._consumer = self._consumer, None
        self._kept.clear()
        self._own.clear()
        for seq in list(self._waiting):
            self._wake(seq)
        self._heap.clear()
        if sub is not None:
            await _quietly(sub.unsubscribe())
        if consumer:
            await self._delete(consumer)

    async def _delete(self, consumer: str) -> None:
        """Delete the feed's consumer (best effort: the server deletes it INACTIVE_NS after
        nobody listens)."""
        if not consumer or self._connection.nc is None:
            return
        subject = subjects.CONSUMER_DELETE.format(stream=self._connection.stream, consumer=consumer)
        await _quietly(self._connection.api(subject, None, 1.0))

    async def close(self) -> None:
        """Stop the feed and any start of it still under way."""
        starting, self._starting = self._starting, None
        await cancel_unfinished(starting)
        await self.stop()


async def _quietly(call: Any) -> None:
    try:
        await call
    except Exception as exc:
        logger.debug("claims feed: %s", errors.describe(exc))
