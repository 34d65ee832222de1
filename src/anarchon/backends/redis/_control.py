"""The Redis backend's pauses and run requests: two hashes under the backend's prefix ``P``.

==============================  =====  =========================================================
key                             type   contents
==============================  =====  =========================================================
``P{control}:pauses``           hash   job name or ``*`` -> the pause as JSON (``job``, ``by``,
                                       ``at_ms``, ``until_ms`` when set) plus ``reason``: the
                                       text :func:`anarchon.control.paused_reason` gives, which
                                       the claim script records as is
``P{control}:requests``         hash   request id -> the run request as JSON
==============================  =====  =========================================================

Both carry the hash tag ``{control}`` (one Redis Cluster slot). Every call is one command or one
script, so each is atomic. The claim script reads the pauses hash itself (its sixth key, an
``HGET`` of the job and of ``*``), except on a Redis Cluster: there the pauses live in another
slot than the job's keys, so the backend reads them (one ``HMGET``) just before it sends a batch
of claims and passes them to the scripts (see ``docs/backends/redis.md``).

Requests are few (a trigger, a retry waiting for its backoff), so :meth:`RedisControl.requests`
reads the whole hash and sorts it here. Reads of keys that were never written answer empty and
create nothing.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

from anarchon.control import Pause, RunRequest, paused_reason

from ._rows import text

if TYPE_CHECKING:
    from . import RedisBackend

__all__ = ["RedisControl", "stored_pause"]

# Remove one field and answer what it held (Redis before 8 has no HGETDEL).
TAKE: Final = """
local value = redis.call('HGET', KEYS[1], ARGV[1])
if value then
  redis.call('HDEL', KEYS[1], ARGV[1])
end
return value
"""

# Remove one field only while it holds exactly the given value.
FORGET: Final = """
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then
  return redis.call('HDEL', KEYS[1], ARGV[1])
end
return 0
"""


def stored_pause(pause: Pause) -> str:
    """The value the pauses hash keeps for ``pause``: its fields (no null: absent in Lua) and
    its rendered reason, so the claim script records exactly :func:`paused_reason`."""
    fields = {k: v for k, v in pause.to_dict().items() if v is not None}
    fields["reason"] = paused_reason(pause)
    return json.dumps(fields, separators=(",", ":"), sort_keys=True)


class RedisControl:
    """A :class:`~anarchon.control.ControlStore` in two hashes (see the module docstring)."""

    def __init__(self, backend: RedisBackend) -> None:
        self._backend = backend
        self._keys = backend._keys.control

    async def pause(self, pause: Pause) -> None:
        """See :meth:`anarchon.control.ControlStore.pause`."""
        if not isinstance(pause, Pause):
            raise TypeError(f"pause={pause!r} must be an anarchon.control.Pause")
        connection = self._backend._connection
        client = connection.client()
        await connection.call(client.hset(self._keys.pauses, pause.job, stored_pause(pause)))

    async def resume(self, job: str) -> Pause | None:
        """See :meth:`anarchon.control.ControlStore.resume`."""
        connection = self._backend._connection
        raw = await connection.call(connection.client().eval(TAKE, 1, self._keys.pauses, job))
        return None if raw is None else Pause.from_json(text(raw))

    async def pauses(self) -> list[Pause]:
        """See :meth:`anarchon.control.ControlStore.pauses`."""
        connection = self._backend._connection
        values = await connection.call(connection.client().hvals(self._keys.pauses))
        return [Pause.from_json(text(value)) for value in values]

    async def request(self, request: RunRequest) -> bool:
        """See :meth:`anarchon.control.ControlStore.request`: ``HSETNX``."""
        if not isinstance(request, RunRequest):
            raise TypeError(f"request={request!r} must be an anarchon.control.RunRequest")
        connection = self._backend._connection
        client = connection.client()
        stored = await connection.call(
            client.hsetnx(self._keys.requests, request.id, request.to_json())
        )
        return bool(stored)

    async def forget(self, request: RunRequest) -> None:
        """Remove ``request`` if the hash holds exactly it: a retry a cluster stored ahead of
        its result (see ``RedisBackend.finish_many``) whose result was then refused. Another
        run's request of the same id (its ``requested_by`` names that run) stays."""
        connection = self._backend._connection
        client = connection.client()
        await connection.call(
            client.eval(FORGET, 1, self._keys.requests, request.id, request.to_json())
        )

    async def requests(self, jobs: Sequence[str] | None = None) -> list[RunRequest]:
        """See :meth:`anarchon.control.ControlStore.requests`: one ``HVALS``, due first."""
        wanted = None if jobs is None else set(jobs)
        if wanted is not None and not wanted:
            return []
        connection = self._backend._connection
        values = await connection.call(connection.client().hvals(self._keys.requests))
        found = (RunRequest.from_json(text(value)) for value in values)
        chosen = [r for r in found if wanted is None or r.job in wanted]
        return sorted(chosen, key=lambda r: (r.due_ms, r.requested_at_ms, r.id))

    async def done(self, request_id: str) -> None:
        """See :meth:`anarchon.control.ControlStore.done`: ``HDEL``."""
        connection = self._backend._connection
        await connection.call(connection.client().hdel(self._keys.requests, request_id))

    async def held(self, jobs: Sequence[str]) -> dict[str, str]:
        """The stored pauses of ``jobs`` and of every job, as the claim script reads them (one
        ``HMGET``): for a Redis Cluster, whose claim scripts cannot read the pauses' slot."""
        names = [*dict.fromkeys(jobs), "*"]
        connection = self._backend._connection
        values = await connection.call(connection.client().hmget(self._keys.pauses, names))
        return {name: text(v) for name, v in zip(names, values, strict=True) if v is not None}
