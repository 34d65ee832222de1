"""The NATS backend's registry: a JetStream key-value bucket beside the backend's stream.

The bucket is ``<stream>_registry`` (or ``anarchon_registry_<hash of the stream name>`` when the
stream's name has characters a bucket name cannot), keeping one revision per key; the key of an
instance is ``<prefix>.<instance id>``, both base64url-encoded so any printable id fits the key
rules. The bucket is created on the first write (idempotently), again by a running instance
that used it if it is lost (:mod:`._guard`), and never by a read.

What is atomic here and what is not:

* recording an instance is one ``put`` of its whole record: atomic;
* removing one instance is one purge of its key: atomic, and it leaves no delete marker;
* removing silent instances is *not* one step: the records are read (one ephemeral consumer
  delivers each key's last message; or the last such read is taken, see
  ``NatsRegistry.remove_silent``), and each silent one deleted with a compare-and-set on the
  revision that was read, then its key purged up to that delete's marker. A record refreshed
  in between is therefore never deleted (its revision changed), but the read is a snapshot: a
  record written after it was taken is looked at after the next read.

No removal leaves a delete marker behind: every read delivers each key's last message, markers
included, so markers, one per instance ever stopped, would make each heartbeat of a long-lived
cluster read more. A marker a removal left (one that stopped between its delete and its purge,
or an earlier version's) is purged by the next ``remove_silent``.

Definitions sets (:func:`anarchon.registry.record_instance`) are kept in a second bucket,
``<stream>_definitions`` (same naming rule), one revision per key: a set of digest ``D`` is
cut into chunks ``<prefix>.D.0``, ``<prefix>.D.1``, ... each under the server's maximum
payload (100 000 jobs compress to a few hundred kilobytes), and its manifest ``<prefix>.D.m``
(JSON: chunks, size, saved time) is written last with a compare-and-set create, so a reader
that finds the manifest finds every chunk. Touching a set (or saving one already kept) moves
its saved time with a compare-and-set update of the manifest alone, read again on a conflict (a
conflict with a prune's delete then finds no manifest, and a save writes the set anew).
Pruning lists the manifests, deletes each old unnamed one with a compare-and-set on the revision
it read (a set touched or saved since is kept), then purges the set's keys of every message
stored up to that delete's marker, the marker included, so a pruned set leaves nothing behind
(kept, the markers would pile up, one per pruned set, and each prune would read them all). A
save of ``D`` in between (its touch finds no manifest) writes the same keys again, stored after
the marker, which that purge leaves: deleting the chunks key by key, as before, removed them and
left the new manifest naming missing chunks. That save's create, which read the marker, finds
it purged and creates again. A marker left by a prune that stopped before its purge is purged by
the next prune. The chunks of a save that stopped before its manifest stay until the digest is
saved again (the same keys) or a later prune of it.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import re
from collections.abc import Awaitable, Collection
from functools import partial
from typing import TYPE_CHECKING, Any, Final, TypeVar

from anarchon.errors import BackendError, BackendUnavailable
from anarchon.registry import InstanceRecord

from . import _errors as errors
from . import _timings as timings
from ._buckets import until_answered

if TYPE_CHECKING:
    from nats.js.errors import KeyNotFoundError
    from nats.js.kv import KeyValue

    from ._backend import NatsBackend

__all__ = ["BUCKET_KINDS", "NatsRegistry", "bucket_name", "bucket_streams", "token"]

T = TypeVar("T")
# A chunk leaves this much of the server's maximum payload to the message's headers.
CHUNK_MARGIN: Final = 4096
BUCKET_RULE: Final = re.compile(r"[A-Za-z0-9_-]{1,200}")


def bucket_name(stream: str, kind: str = "registry") -> str:
    """The key-value bucket beside ``stream`` that holds ``kind`` (``registry``: its instances;
    ``control``: pauses and run requests)."""
    if BUCKET_RULE.fullmatch(stream):
        return f"{stream}_{kind}"
    digest = hashlib.sha256(stream.encode()).hexdigest()[:16]
    return f"anarchon_{kind}_{digest}"


#: What the key-value buckets beside a stream hold (:func:`bucket_name`'s ``kind``).
BUCKET_KINDS: Final = ("registry", "definitions", "control")


def bucket_streams(stream: str) -> tuple[str, ...]:
    """The JetStream streams (``KV_<bucket>``) of the key-value buckets beside ``stream``: what
    to delete with it when removing it for good."""
    return tuple(f"KV_{bucket_name(stream, kind)}" for kind in BUCKET_KINDS)


def token(text: str) -> str:
    """``text`` as one key-value key token (base64url, unpadded; ``_`` for the empty text)."""
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=") or "_"


class NatsRegistry:
    """A :class:`~anarchon.registry.RegistryStore` in a JetStream key-value bucket."""

    def __init__(self, backend: NatsBackend) -> None:
        self._backend = backend
        self._bucket = bucket_name(backend.stream)
        self._kv: KeyValue | None = None
        self._sets_bucket = bucket_name(backend.stream, "definitions")
        self._sets_kv: KeyValue | None = None
        self._space = token(backend.prefix)
        # The last read of the records (loop time, entries): see remove_silent.
        self._snapshot: tuple[float, list[tuple[str, int, InstanceRecord | None]]] | None = None

    def _key(self, instance_id: str) -> str:
        return f"{self._space}.{token(instance_id)}"

    async def _bounded(
        self, aw: Awaitable[T], doing: str, limit_s: float = timings.CALL_TIMEOUT_S
    ) -> T:
        try:
            async with asyncio.timeout(limit_s):
                return await aw
        except Exception as exc:
            self._backend._conn.note_failure(exc)  # the bucket may be gone: the guard looks
            if isinstance(exc, TimeoutError):
                raise BackendUnavailable(
                    f"NATS: {doing} failed: no answer within {limit_s:g} s"
                ) from None
            if isinstance(exc, BackendError):
                raise
            raise errors.translate(exc, doing) from exc

    async def _open(self, create: bool) -> KeyValue | None:
        if self._kv is None:
            self._kv = await self._backend._buckets.open_bucket(
                self._bucket, create=create, doing="opening the registry", bounded=self._bounded
            )
        return self._kv

    async def _open_sets(self, create: bool) -> KeyValue | None:
        if self._sets_kv is None:
            self._sets_kv = await self._backend._buckets.open_bucket(
                self._sets_bucket,
                create=create,
                doing="opening the registry",
                bounded=self._bounded,
            )
        return self._sets_kv

    async def record(self, instance: InstanceRecord) -> None:
        """See :meth:`anarchon.registry.RegistryStore.record`."""
        kv = await self._open(create=True)
        assert kv is not None
        key, value = self._key(instance.id), instance.to_json().encode()
        await self._bounded(
            until_answered(
                lambda: kv.put(key, value), "recording an instance", timings.BUCKET_RETRY_S
            ),
            "recording an instance",
        )

    async def _entries(self) -> list[tuple[str, int, InstanceRecord | None]]:
        """Each key's revision and record: None for a key whose last message is a delete
        marker (its sequence then), which :meth:`remove_silent` purges. One consumer reads
        the bucket, where a read per key made each beat of each instance cost as many
        requests as the fleet has instances."""

        async def read() -> list[tuple[str, int, InstanceRecord | None]]:
            found: list[tuple[str, int, InstanceRecord | None]] = []
            for key, message in await self._backend._buckets.read_bucket(
                self._bucket, self._space + "."
            ):
                if not message.data:  # a record is never empty: a delete or purge marker
                    found.append((key, message.seq, None))
                    continue
                record = InstanceRecord.from_json(message.data)
                if record is not None:
                    found.append((key, message.seq, record))
            return found

        return await self._bounded(read(), "reading the registry")

    async def instances(self) -> list[InstanceRecord]:
        """See :meth:`anarchon.registry.RegistryStore.instances`."""
        if await self._open(create=False) is None:
            return []
        entries = await self._entries()
        self._snapshot = (asyncio.get_running_loop().time(), entries)
        return [record for _, _, record in entries if record is not None]

    async def exists(self) -> bool:
        """See :meth:`anarchon.registry.RegistryStore.exists`."""
        return await self._open(create=False) is not None

    @property
    def missing_text(self) -> str:
        """Why :meth:`exists` answers False, for the ``anarchon`` commands: no scheduler
        recorded itself, or the bucket was lost under running ones (which make it again)."""
        return (
            f"no scheduler recorded itself: key-value bucket {self._bucket!r} does not exist. "
            "If schedulers are running on stream "
            f"{self._backend.stream!r}, the bucket was deleted or its server lost its store: "
            "they create it again within about a minute and record themselves at their next "
            "heartbeat; try again then"
        )

    async def remove(self, instance_id: str) -> None:
        """See :meth:`anarchon.registry.RegistryStore.remove`."""
        kv = await self._open(create=False)
        if kv is not None:
            await self._bounded(
                self._backend._buckets.purge_keys(self._bucket, self._key(instance_id)),
                "removing an instance",
            )

    async def remove_silent(self, cutoff_ms: int) -> list[str]:
        """See :meth:`anarchon.registry.RegistryStore.remove_silent` and the module docstring:
        a compare-and-set delete of each silent record, as last read.

        The records are those of the last :meth:`instances` read when it is at most
        :data:`._timings.SNAPSHOT_MAX_S` old (the heartbeat reads the registry at every beat, just
        after this), else read now: a read is a consumer made, read and deleted on the server, and
        reading twice a beat doubled the registry's share of a fleet's load on NATS. The
        compare-and-set on the revision read keeps it exact for the records read (one refreshed
        since is never deleted); a record first written after that read is looked at after the next
        one."""

        if await self._open(create=False) is None:
            return []
        snapshot, self._snapshot = self._snapshot, None
        if (
            snapshot is not None
            and asyncio.get_running_loop().time() - snapshot[0] <= timings.SNAPSHOT_MAX_S
        ):
            entries = snapshot[1]
        else:
            entries = await self._entries()
        removed = []
        buckets = self._backend._buckets
        for key, revision, record in entries:
            if record is None:
                marker = revision  # left by a removal that did not purge it
            elif record.heartbeat_ms >= cutoff_ms:
                continue
            else:
                deleted = await self._bounded(
                    buckets.delete_key(self._bucket, key, revision), "removing an instance"
                )
                if deleted is None:
                    continue  # refreshed since it was read: the revision no longer matches
                marker = deleted
                removed.append(record.id)
            # A record the instance wrote since (it was alive) is kept.
            await self._bounded(
                self._purge_to_marker(self._bucket, key, marker), "removing an instance"
            )
        return removed

    # -- definitions sets ---------------------------------------------------------------------

    def _set_key(self, digest: str, part: str) -> str:
        return f"{self._space}.{digest}.{part}"

    async def _manifest(self, kv: KeyValue, digest: str) -> tuple[dict[str, Any], int] | None:
        """The set's manifest and its revision; None if there is none (or it is unreadable)."""
        from nats.js.errors import KeyNotFoundError

        try:
            entry = await kv.get(self._set_key(digest, "m"))
        except KeyNotFoundError:
            return None
        manifest = _manifest_of(entry.value)
        return None if manifest is None else (manifest, entry.revision or 0)

    async def save_definitions(self, digest: str, data: bytes, saved_ms: int) -> None:
        """See :meth:`anarchon.registry.RegistryStore.save_definitions` and the module
        docstring: the chunks, then the manifest (compare-and-set)."""
        from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError

        kv = await self._open_sets(create=True)
        assert kv is not None
        nc, _ = self._backend._conn.require()
        size = max(1024, nc.max_payload - CHUNK_MARGIN)

        async def save() -> None:
            if await self._touch(kv, digest, saved_ms):
                return
            chunks = [data[at : at + size] for at in range(0, len(data), size)] or [b""]
            for n, chunk in enumerate(chunks):
                await until_answered(
                    partial(kv.put, self._set_key(digest, str(n)), chunk),
                    "saving a definitions set",
                    timings.BUCKET_RETRY_S,
                )
            manifest = json.dumps({"chunks": len(chunks), "size": len(data), "saved_ms": saved_ms})
            while True:
                try:
                    await until_answered(
                        lambda: kv.create(self._set_key(digest, "m"), manifest.encode()),
                        "saving a definitions set",
                        timings.BUCKET_RETRY_S,
                    )
                    return
                except (KeyWrongLastSequenceError, KeyNotFoundError):
                    # Another instance saved it meanwhile (the same bytes), or a prune purged
                    # the delete marker create() had found there: then create again.
                    if await self._manifest(kv, digest) is not None:
                        return

        await self._bounded(save(), "saving a definitions set", timings.SET_TIMEOUT_S)

    async def _touch(self, kv: KeyValue, digest: str, saved_ms: int) -> bool:
        """Move the saved time in the set's manifest (a compare-and-set update of the revision
        read, read again when another instance touched or pruned it meanwhile); False when
        there is no manifest. Only the manifest is written, never a chunk."""
        from nats.js.errors import KeyWrongLastSequenceError

        while True:
            found = await self._manifest(kv, digest)
            if found is None:
                return False
            manifest, revision = found
            if int(manifest.get("saved_ms", 0)) >= saved_ms:
                return True  # a prune that reads this revision keeps it, as after an update
            manifest["saved_ms"] = saved_ms
            body = json.dumps(manifest).encode()
            try:
                await until_answered(
                    partial(kv.update, self._set_key(digest, "m"), body, last=revision),
                    "touching a definitions set",
                    timings.BUCKET_RETRY_S,
                )
            except KeyWrongLastSequenceError:
                continue
            return True

    async def touch_definitions(self, digest: str, saved_ms: int) -> bool:
        """See :meth:`anarchon.registry.RegistryStore.touch_definitions` and the module
        docstring: a compare-and-set update of the manifest (the chunks are not sent). A prune
        deletes the manifest with a compare-and-set on the revision it read, so of the two the
        later one fails: a prune after the touch keeps the set, a touch after the prune finds
        it gone and answers False."""
        kv = await self._open_sets(create=False)
        if kv is None:
            return False
        return await self._bounded(self._touch(kv, digest, saved_ms), "touching a definitions set")

    async def definitions(self, digest: str) -> bytes | None:
        """See :meth:`anarchon.registry.RegistryStore.definitions`."""
        from nats.js.errors import KeyNotFoundError

        kv = await self._open_sets(create=False)
        if kv is None:
            return None

        async def read() -> bytes | None:
            found = await self._manifest(kv, digest)
            if found is None:
                return None
            manifest, _ = found
            parts = []
            try:
                for n in range(int(manifest["chunks"])):
                    parts.append((await kv.get(self._set_key(digest, str(n)))).value or b"")
            except (KeyNotFoundError, KeyError, ValueError, TypeError):
                return None  # pruned while it was read, or a damaged manifest
            data = b"".join(parts)
            return data if len(data) == manifest.get("size") else None

        return await self._bounded(read(), "reading a definitions set", timings.SET_TIMEOUT_S)

    async def has_definitions(self, digest: str) -> bool:
        """See :meth:`anarchon.registry.RegistryStore.has_definitions`."""
        kv = await self._open_sets(create=False)
        if kv is None:
            return False
        found = await self._bounded(self._manifest(kv, digest), "looking for a definitions set")
        return found is not None

    async def prune_definitions(self, keep: Collection[str], cutoff_ms: int) -> list[str]:
        """See :meth:`anarchon.registry.RegistryStore.prune_definitions` and the module
        docstring: a compare-and-set delete of each old manifest, then a purge of the set's
        keys up to that delete's marker."""
        from nats.js.errors import KeyNotFoundError

        kv = await self._open_sets(create=False)
        if kv is None:
            return []
        kept = set(keep)
        buckets = self._backend._buckets

        async def prune() -> list[str]:
            keys = await buckets.bucket_keys(self._sets_bucket, self._space + ".")
            gone = []
            for key in keys:
                digest, _, part = key[len(self._space) + 1 :].rpartition(".")
                if part != "m" or digest in kept:
                    continue
                set_keys = self._set_key(digest, "*")
                try:
                    entry = await kv.get(key)
                except KeyNotFoundError as exc:
                    # A delete marker is one a prune left when it stopped before its purge.
                    left = _marker_of(exc)
                    if left is not None:
                        await self._purge_to_marker(self._sets_bucket, set_keys, left)
                    continue
                manifest = _manifest_of(entry.value)
                if manifest is None or int(manifest.get("saved_ms", 0)) >= cutoff_ms:
                    continue
                marker = await buckets.delete_key(self._sets_bucket, key, entry.revision or 0)
                if marker is None:
                    continue  # touched or saved again since it was read: in use
                # A save of the digest since then wrote after the marker, and is kept.
                await self._purge_to_marker(self._sets_bucket, set_keys, marker)
                gone.append(digest)
            return gone

        return await self._bounded(prune(), "pruning definitions sets", timings.SET_TIMEOUT_S)

    async def _purge_to_marker(self, bucket: str, keys: str, marker: int) -> None:
        """Remove the messages of ``keys`` (a key or a filter) in ``bucket`` stored up to the
        delete marker at sequence ``marker``, the marker included; what was written after it
        stays."""
        await self._backend._buckets.purge_keys(bucket, keys, before_seq=marker + 1)


def _manifest_of(value: bytes | None) -> dict[str, Any] | None:
    """A definitions set's manifest from its stored bytes; None if they are not one."""
    try:
        manifest = json.loads(value or b"")
    except ValueError:
        return None
    return manifest if isinstance(manifest, dict) else None


def _marker_of(exc: KeyNotFoundError) -> int | None:
    """The sequence of the delete marker a key's read found (nats-py's ``get`` raises
    KeyNotFoundError with the marker's entry); None when the key holds no message."""
    entry = exc.entry
    return entry.revision or None if entry is not None else None
