"""Reading many stored messages at once, through a short-lived ephemeral pull consumer: every
message on a subject filter (a job's claims or results, for history), or each subject's last (a
key-value bucket's entries, for the registry). One consumer reads them all in batches, where a
direct get is one request per message.
"""

from __future__ import annotations

import logging
import uuid
from typing import TYPE_CHECKING, Final

from . import _errors as errors
from . import _records as records
from . import _timings as timings
from ._records import Stored

if TYPE_CHECKING:
    from nats.js import JetStreamContext

    from ._connection import Connection

logger = logging.getLogger("anarchon.backends.nats")

#: Messages each fetch of the consumer asks for.
FETCH_BATCH: Final = 500


async def read_through_consumer(
    connection: Connection,
    stream: str,
    filter_subject: str,
    *,
    last_per_subject: bool,
    fetch_wait_s: float,
) -> list[Stored]:
    """The messages of ``stream`` on ``filter_subject``, through a short-lived ephemeral pull
    consumer (one filter: nats-server 2.9 ignores multi-subject filters); every message, or only
    each subject's last. Each fetch waits up to ``fetch_wait_s``."""
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

    _, js = connection.require()
    name = f"anarchon_{uuid.uuid4().hex}"
    config = ConsumerConfig(
        name=name,
        ack_policy=AckPolicy.NONE,
        deliver_policy=(DeliverPolicy.LAST_PER_SUBJECT if last_per_subject else DeliverPolicy.ALL),
        filter_subject=filter_subject,
        inactive_threshold=timings.CONSUMER_INACTIVE_S,
        mem_storage=True,
    )
    info = await js.add_consumer(stream, config=config)
    try:
        pending = info.num_pending or 0
        if pending == 0:
            return []
        sub = await js.pull_subscribe_bind(consumer=name, stream=stream)
        try:
            return await _drain(sub, pending, fetch_wait_s)
        finally:
            await sub.unsubscribe()
    finally:
        await _forget_consumer(connection, stream, name)


async def _drain(
    sub: JetStreamContext.PullSubscription, pending: int, fetch_wait_s: float
) -> list[Stored]:
    out: list[Stored] = []
    left = pending
    while left > 0 and len(out) < pending:
        batch = await sub.fetch(min(FETCH_BATCH, pending - len(out)), timeout=fetch_wait_s)
        if not batch:
            break
        for msg in batch:
            fields = records.ack_fields(msg.reply or "")
            if fields is None:
                continue
            seq, time_ms, left = fields
            out.append(Stored(seq=seq, subject=msg.subject, time_ms=time_ms, data=msg.data))
    return out


async def _forget_consumer(connection: Connection, stream: str, name: str) -> None:
    js = connection.js  # None once the connection is closed
    if js is None:
        return
    try:
        await js.delete_consumer(stream, name)
    except Exception as exc:  # it expires by itself after CONSUMER_INACTIVE_S
        logger.debug("could not delete consumer %s: %s", name, errors.describe(exc))
