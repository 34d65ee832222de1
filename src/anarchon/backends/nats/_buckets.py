"""The key-value buckets beside the stream (registry, definitions, control): finding or making
one, listing its keys, reading each key's last entry, purging keys and compare-and-set deletes,
through the backend's :class:`._connection.Connection`.

A bucket's write or lookup is made again while nobody answers it (:func:`until_answered`): a
bucket just created, a leader being elected. What losing each kind of bucket costs is
:data:`BUCKET_LOSS` (the guard, :mod:`._guard`, makes a lost one again).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final, TypeVar

from ...errors import BackendError
from ...kit import Action, log_fields
from ...kit.calls import retrying
from . import _errors as errors
from . import _timings as timings
from ._connection import Connection, retry_logger
from ._errors import JetStreamError
from ._reads import read_through_consumer
from ._records import Stored

if TYPE_CHECKING:
    from nats.js.kv import KeyValue

logger = logging.getLogger("anarchon.backends.nats")

T = TypeVar("T")


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


async def until_answered(call: Callable[[], Awaitable[T]], doing: str, within_s: float) -> T:
    """``call()`` (a key-value bucket's write or lookup), made again for up to ``within_s``
    while JetStream's answer is that nobody took it (:func:`._errors.is_unanswered`): no
    responders for a bucket just created (its stream's interest not yet known to the server
    this client talks to, in a cluster), a leader being elected. Nothing was stored then, so a
    retry cannot write twice; a timeout is never retried here. The loop is the kit's
    (:func:`anarchon.kit.calls.retrying`). The last failure is raised as it is: the caller's
    bounded call translates it."""
    return await retrying(
        call,
        is_transient=errors.is_unanswered,
        deadline_s=within_s,
        first_s=timings.RETRY_FIRST_S,
        cap_s=timings.RETRY_CAP_S,
        on_retry=retry_logger(doing),
    )


class Buckets:
    """The key-value buckets of one backend, through its connection (created with the
    stream's replicas, read when the stream was prepared)."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection
        self.seen: set[str] = set()
        """The buckets found or made here: the guard makes them again if they are lost."""

    async def bucket_keys(self, bucket: str, start: str) -> list[str]:
        """The keys of key-value bucket ``bucket`` that begin with ``start`` (which ends with a
        dot), read from the bucket's stream info rather than nats-py's ``keys()``: its watcher
        can report an empty bucket before the entries it already holds arrive (nats.py #842).
        A key whose last entry is a delete marker is listed; reading it finds it deleted."""
        prefix = f"$KV.{bucket}."
        found = await self._connection.subjects(f"KV_{bucket}", f"{prefix}{start}>")
        return [subject[len(prefix) :] for subject in found]

    async def purge_keys(self, bucket: str, keys: str, before_seq: int | None = None) -> None:
        """Remove the messages of the keys of key-value bucket ``bucket`` that match ``keys``
        (one key, or a filter ending in ``*`` or ``>``); with ``before_seq``, only those stored
        before that sequence. Unlike a delete, a purge leaves no marker behind."""
        _, js = self._connection.require()
        await js.purge_stream(f"KV_{bucket}", seq=before_seq, subject=f"$KV.{bucket}.{keys}")

    async def delete_key(self, bucket: str, key: str, last: int) -> int | None:
        """Put a delete marker on key ``key`` of key-value bucket ``bucket`` if its last revision
        is still ``last`` (a compare-and-set delete); the marker's sequence, or None when the key
        was written or removed since. nats-py's ``KeyValue.delete`` answers neither: its
        publish's ack is dropped, and a lost compare-and-set raises a generic 400."""
        from nats.js.errors import APIError

        _, js = self._connection.require()
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

        _, js = self._connection.require()
        within = timings.BUCKET_RETRY_S

        try:
            kv: KeyValue = await bounded(
                until_answered(lambda: js.key_value(bucket), doing, within), doing
            )
            self.seen.add(bucket)
            return kv
        except BackendError as exc:
            if not isinstance(exc.__cause__, BucketNotFoundError):
                raise
            if not create:
                return None
        config = KeyValueConfig(bucket=bucket, history=1, replicas=self._connection.replicas)
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
        if made_here and bucket in self.seen:
            logger.warning(
                "re-created key-value bucket %s (one revision per key, R%d): it was lost under "
                "this running instance (deleted, or its server lost its store), and what it held "
                "is gone: %s",
                bucket,
                self._connection.replicas,
                bucket_loss(bucket),
                extra=log_fields(Action.BUCKET_RECREATED, stream=f"KV_{bucket}"),
            )
        self.seen.add(bucket)
        return made

    async def read_bucket(self, bucket: str, start: str) -> list[tuple[str, Stored]]:
        """The last message of each key of key-value bucket ``bucket`` that begins with
        ``start`` (which ends with a dot), as ``(key, message)``; the message's ``seq`` is the
        key's revision, and a delete marker comes with empty data. One consumer reads them
        all, where nats-py's ``get`` is one request per key."""
        prefix = f"$KV.{bucket}."
        found = await read_through_consumer(
            self._connection,
            f"KV_{bucket}",
            f"{prefix}{start}>",
            last_per_subject=True,
            fetch_wait_s=timings.REQUEST_TIMEOUT_S,
        )
        return [(message.subject[len(prefix) :], message) for message in found]
