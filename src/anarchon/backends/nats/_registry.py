"""The NATS backend's registry: a JetStream key-value bucket beside the backend's stream.

The bucket is ``<stream>_registry`` (or ``anarchon_registry_<hash of the stream name>`` when the
stream's name has characters a bucket name cannot), keeping one revision per key; the key of an
instance is ``<prefix>.<instance id>``, both base64url-encoded so any printable id fits the key
rules. The bucket is created on the first write (idempotently) and never by a read.

What is atomic here and what is not:

* recording an instance is one ``put`` of its whole record: atomic;
* removing one instance is one delete: atomic;
* removing silent instances is *not* one step: the keys are listed, each record read, and
  each silent one deleted with a compare-and-set on the revision that was read. A record
  refreshed in between is therefore never deleted (its revision changed), but the list is a
  snapshot: a record written after it was taken is looked at on the next heartbeat.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import re
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, Final, TypeVar

from anarchon.errors import BackendError, BackendUnavailable
from anarchon.registry import InstanceRecord

from . import _errors as errors

if TYPE_CHECKING:
    from nats.js.kv import KeyValue

    from ._backend import NatsBackend

__all__ = ["NatsRegistry", "bucket_name", "token"]

T = TypeVar("T")
CALL_TIMEOUT_S: Final = 5.0
BUCKET_RULE: Final = re.compile(r"[A-Za-z0-9_-]{1,200}")


def bucket_name(stream: str, kind: str = "registry") -> str:
    """The key-value bucket beside ``stream`` that holds ``kind`` (``registry``: its instances;
    ``control``: pauses and run requests)."""
    if BUCKET_RULE.fullmatch(stream):
        return f"{stream}_{kind}"
    digest = hashlib.sha256(stream.encode()).hexdigest()[:16]
    return f"anarchon_{kind}_{digest}"


def token(text: str) -> str:
    """``text`` as one key-value key token (base64url, unpadded; ``_`` for the empty text)."""
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=") or "_"


class NatsRegistry:
    """A :class:`~anarchon.registry.RegistryStore` in a JetStream key-value bucket."""

    def __init__(self, backend: NatsBackend) -> None:
        self._backend = backend
        self._bucket = bucket_name(backend.stream)
        self._kv: KeyValue | None = None
        self._space = token(backend.prefix)

    def _key(self, instance_id: str) -> str:
        return f"{self._space}.{token(instance_id)}"

    async def _bounded(self, aw: Awaitable[T], doing: str) -> T:
        try:
            async with asyncio.timeout(CALL_TIMEOUT_S):
                return await aw
        except TimeoutError:
            raise BackendUnavailable(
                f"NATS: {doing} failed: no answer within {CALL_TIMEOUT_S:g} s"
            ) from None
        except BackendError:
            raise
        except Exception as exc:
            raise errors.translate(exc, doing) from exc

    async def _open(self, create: bool) -> KeyValue | None:
        if self._kv is not None:
            return self._kv
        from nats.js.errors import BucketNotFoundError

        _, js = self._backend._conn.require()
        try:
            self._kv = await self._bounded(js.key_value(self._bucket), "opening the registry")
        except BackendError as exc:
            if not isinstance(exc.__cause__, BucketNotFoundError):
                raise
            if not create:
                return None
            from nats.js.api import KeyValueConfig

            config = KeyValueConfig(bucket=self._bucket, history=1)
            self._kv = await self._bounded(
                js.create_key_value(config), f"creating key-value bucket {self._bucket!r}"
            )
        return self._kv

    async def record(self, instance: InstanceRecord) -> None:
        """See :meth:`anarchon.registry.RegistryStore.record`."""
        kv = await self._open(create=True)
        assert kv is not None
        await self._bounded(
            kv.put(self._key(instance.id), instance.to_json().encode()), "recording an instance"
        )

    async def _entries(self, kv: KeyValue) -> list[tuple[str, int, InstanceRecord]]:
        from nats.js.errors import KeyNotFoundError

        async def read() -> list[tuple[str, int, InstanceRecord]]:
            keys = await self._backend._conn.bucket_keys(self._bucket, self._space + ".")
            found = []
            for key in keys:
                try:
                    entry = await kv.get(key)
                except KeyNotFoundError:
                    continue  # deleted since it was listed
                record = InstanceRecord.from_json(entry.value or b"")
                if record is not None:
                    found.append((key, entry.revision or 0, record))
            return found

        return await self._bounded(read(), "reading the registry")

    async def instances(self) -> list[InstanceRecord]:
        """See :meth:`anarchon.registry.RegistryStore.instances`."""
        kv = await self._open(create=False)
        return [] if kv is None else [record for _, _, record in await self._entries(kv)]

    async def exists(self) -> bool:
        """See :meth:`anarchon.registry.RegistryStore.exists`."""
        return await self._open(create=False) is not None

    async def remove(self, instance_id: str) -> None:
        """See :meth:`anarchon.registry.RegistryStore.remove`."""
        kv = await self._open(create=False)
        if kv is not None:
            await self._bounded(kv.delete(self._key(instance_id)), "removing an instance")

    async def remove_silent(self, cutoff_ms: int) -> list[str]:
        """See :meth:`anarchon.registry.RegistryStore.remove_silent` and the module docstring:
        list, read, then a compare-and-set delete per silent record."""
        from nats.js.errors import APIError

        kv = await self._open(create=False)
        if kv is None:
            return []
        removed = []
        for key, revision, record in await self._entries(kv):
            if record.heartbeat_ms >= cutoff_ms:
                continue
            try:
                await self._bounded(self._delete(kv, key, revision), "removing an instance")
            except BackendError as exc:
                if isinstance(exc.__cause__, APIError) and not isinstance(exc, BackendUnavailable):
                    continue  # refreshed since it was read: the revision no longer matches
                raise
            removed.append(record.id)
        return removed

    @staticmethod
    async def _delete(kv: Any, key: str, revision: int) -> None:
        await kv.delete(key, last=revision)
