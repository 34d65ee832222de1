"""The Redis backend's registry: two keys of its own under the backend's prefix ``P``.

=============================  =====  ========================================================
key                            type   contents
=============================  =====  ========================================================
``P{registry}:instances``      hash   instance id -> its record as JSON
``P{registry}:beats``          zset   instance id scored by its last heartbeat (epoch ms)
``P{registry}:since``          str    the first heartbeat ever recorded here (epoch ms): tells
                                      "no instance now" from "never any instance"
``P{registry}:sets``           hash   definitions digest -> the set (zlib-compressed JSON, in
                                      base64: a client that decodes replies reads it too)
``P{registry}:saved``          zset   definitions digest scored by when it was last saved
=============================  =====  ========================================================

All carry the hash tag ``{registry}`` (one Redis Cluster slot) and every step is one script,
so each step is atomic. No job's keys collide with them: a job's keys end in ``:meta``,
``:runs``, ``:slots``, ``:order`` or ``:leases``.
"""

from __future__ import annotations

import base64
from collections.abc import Collection
from typing import TYPE_CHECKING, Any, Final

from anarchon.registry import InstanceRecord

if TYPE_CHECKING:
    from . import RedisBackend

__all__ = ["RedisRegistry"]

RECORD: Final = """
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
redis.call('SET', KEYS[3], ARGV[2], 'NX')
return 1
"""
REMOVE: Final = """
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
return 1
"""
REMOVE_SILENT: Final = """
local silent = redis.call('ZRANGE', KEYS[2], '-inf', '(' .. ARGV[1], 'BYSCORE')
for _, id in ipairs(silent) do
  redis.call('HDEL', KEYS[1], id)
  redis.call('ZREM', KEYS[2], id)
end
return silent
"""
# ARGV[1] the digest, ARGV[2] the saved time (moved only forward), ARGV[3] the set.
_MOVE_SAVED: Final = """
local saved = redis.call('ZSCORE', KEYS[2], ARGV[1])
if not saved or tonumber(saved) < tonumber(ARGV[2]) then
  redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
end
return 1
"""
SAVE_SET: Final = (
    """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
end"""
    + _MOVE_SAVED
)
# SAVE_SET without the set: 0 (and nothing changed) when it is not kept.
TOUCH_SET: Final = (
    """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then
  return 0
end"""
    + _MOVE_SAVED
)
# ARGV[1] the cutoff, ARGV[2..] the digests to keep.
PRUNE_SETS: Final = """
local keep = {}
for i = 2, #ARGV do keep[ARGV[i]] = true end
local old = redis.call('ZRANGE', KEYS[2], '-inf', '(' .. ARGV[1], 'BYSCORE')
local gone = {}
for _, digest in ipairs(old) do
  if not keep[digest] then
    redis.call('HDEL', KEYS[1], digest)
    redis.call('ZREM', KEYS[2], digest)
    table.insert(gone, digest)
  end
end
return gone
"""


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RedisRegistry:
    """A :class:`~anarchon.registry.RegistryStore` in a hash and a sorted set."""

    def __init__(self, backend: RedisBackend) -> None:
        self._backend = backend
        base = f"{backend.prefix}{{registry}}:"
        self._keys = [base + "instances", base + "beats", base + "since"]
        self._sets = [base + "sets", base + "saved"]

    async def _eval(self, script: str, *args: str | int) -> Any:
        connection = self._backend._connection
        return await connection.call(connection.client().eval(script, 3, *self._keys, *args))

    async def record(self, instance: InstanceRecord) -> None:
        """See :meth:`anarchon.registry.RegistryStore.record`."""
        await self._eval(RECORD, instance.id, instance.heartbeat_ms, instance.to_json())

    async def instances(self) -> list[InstanceRecord]:
        """See :meth:`anarchon.registry.RegistryStore.instances`."""
        connection = self._backend._connection
        values = await connection.call(connection.client().hvals(self._keys[0]))
        found = (InstanceRecord.from_json(_text(v)) for v in values)
        return [record for record in found if record is not None]

    async def exists(self) -> bool:
        """See :meth:`anarchon.registry.RegistryStore.exists`."""
        connection = self._backend._connection
        count = await connection.call(connection.client().exists(self._keys[2]))
        return bool(count)

    async def remove(self, instance_id: str) -> None:
        """See :meth:`anarchon.registry.RegistryStore.remove`."""
        await self._eval(REMOVE, instance_id)

    async def remove_silent(self, cutoff_ms: int) -> list[str]:
        """See :meth:`anarchon.registry.RegistryStore.remove_silent`."""
        return [_text(v) for v in await self._eval(REMOVE_SILENT, cutoff_ms)]

    async def _eval_sets(self, script: str, *args: str | int | bytes) -> Any:
        connection = self._backend._connection
        return await connection.call(connection.client().eval(script, 2, *self._sets, *args))

    async def save_definitions(self, digest: str, data: bytes, saved_ms: int) -> None:
        """See :meth:`anarchon.registry.RegistryStore.save_definitions`."""
        await self._eval_sets(SAVE_SET, digest, saved_ms, base64.b64encode(data))

    async def definitions(self, digest: str) -> bytes | None:
        """See :meth:`anarchon.registry.RegistryStore.definitions`."""
        connection = self._backend._connection
        value = await connection.call(connection.client().hget(self._sets[0], digest))
        if value is None:
            return None
        try:
            return base64.b64decode(value, validate=True)
        except ValueError:
            return None  # damaged: read as a set nobody saved

    async def has_definitions(self, digest: str) -> bool:
        """See :meth:`anarchon.registry.RegistryStore.has_definitions`."""
        connection = self._backend._connection
        return bool(await connection.call(connection.client().hexists(self._sets[0], digest)))

    async def touch_definitions(self, digest: str, saved_ms: int) -> bool:
        """See :meth:`anarchon.registry.RegistryStore.touch_definitions`: one script."""
        return bool(await self._eval_sets(TOUCH_SET, digest, saved_ms))

    async def prune_definitions(self, keep: Collection[str], cutoff_ms: int) -> list[str]:
        """See :meth:`anarchon.registry.RegistryStore.prune_definitions`: one script."""
        return [_text(v) for v in await self._eval_sets(PRUNE_SETS, cutoff_ms, *sorted(keep))]
