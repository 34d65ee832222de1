"""Redis: claims, leases and history in Redis, every state change one Lua script.

Each decision (claim, renew, release, take over, finish with pruning) is one script on the keys
of one job, run atomically by Redis with Redis's own clock (``TIME``). Releases and finishes are
published on a pub/sub channel, so a backup acts within milliseconds of a hand-over; a lost
message only delays it to the lease expiry.

Works with a plain ``redis.asyncio.Redis``, a Sentinel-managed one
(``Sentinel(...).master_for(...)``) or a ``redis.asyncio.cluster.RedisCluster``: every key of a
job carries the hash tag ``{job}``, so each script stays in one cluster slot.

Where things are (the same files as every backend package):

* the claim path: :meth:`RedisBackend.claim` in ``_backend.py`` sends ``claim.lua`` (with
  ``_common.lua``) once per request, all in one pipeline; ``_rows.claim_outcome`` reads the
  answer. ``_backend.py`` holds the contract methods in the order of :mod:`anarchon.backend`;
* ``_connection.py``: the client, the bounded call (timeout, shield, error translation),
  pipelines and the pub/sub listener; ``_errors.py``: the translation of redis-py's errors;
* ``_options.py``: option checks and ``from_url`` parsing; ``_rows.py``: script arguments and
  answers as runs, tickets and outcomes;
* ``_keys.py``: every key and channel; ``*.lua``: the scripts, loaded by ``_scripts.py``;
* ``_timings.py``: every timeout and wait, with why it is that long.
"""

from __future__ import annotations

from ._backend import RedisBackend
from ._control import RedisControl
from ._registry import RedisRegistry

__all__ = ["RedisBackend", "RedisControl", "RedisRegistry"]
