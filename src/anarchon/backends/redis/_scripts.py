"""The Lua scripts (``*.lua`` next to this module), loaded once and called by their SHA1.

Each script is ``_common.lua`` followed by its own file (``hget_ints.lua`` stands alone).
:class:`ScriptRunner` loads them with SCRIPT LOAD at start (on every primary of a cluster),
calls them with EVALSHA, and loads them again when a server answers NOSCRIPT (it restarted, or
a failover promoted a replica that never saw them). Batches go out as one pipeline: one round
trip for many jobs' claims, each claim its own script call on its own job's keys, so a cluster
routes each to the node of its slot.

A single call on a plain client (one server, or a Sentinel's primary) is written in Redis's
protocol here (:func:`pack`: a job's keys are packed once) and goes to one of the client's pooled
connections as ``Redis.execute_command`` sends a command (the connection's retries, the pool's
checks), without redis-py packing each argument in Python: that packing was a third of a
claim's client instructions (callgrind, redis-py 8.2).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Any, Final

from ._rows import text

if TYPE_CHECKING:
    from redis.asyncio import Redis
    from redis.asyncio.cluster import RedisCluster

__all__ = ["SCRIPTS", "Args", "Call", "Script", "ScriptRunner", "pack"]

NAMES: Final = ("claim", "renew", "release", "take_over", "finish", "history")
# Scripts that stand alone: _common.lua decodes ARGV[1] as JSON and names one job's keys.
PLAIN_NAMES: Final = ("hget_ints",)

# A script's arguments: one JSON string (ARGV[1]), or several strings (ARGV[1], ARGV[2] ...).
Args = str | Sequence[str]
# A call: (the job's keys, the arguments).
Call = tuple[Sequence[str], Args]


@dataclass(frozen=True, slots=True)
class Script:
    """One script's full source and the SHA1 Redis knows it by."""

    name: str
    source: str
    sha: str


def _read(filename: str) -> str:
    return resources.files(__package__ or __name__).joinpath(filename).read_text(encoding="utf-8")


def _build() -> dict[str, Script]:
    common = _read("_common.lua")
    scripts = {}
    for name in NAMES:
        source = f"{common}\n-- {name}.lua\n{_read(f'{name}.lua')}"
        scripts[name] = Script(name, source, hashlib.sha1(source.encode()).hexdigest())
    for name in PLAIN_NAMES:
        source = _read(f"{name}.lua")
        scripts[name] = Script(name, source, hashlib.sha1(source.encode()).hexdigest())
    return scripts


SCRIPTS: Final = _build()


def _argv(args: Args) -> Sequence[str]:
    return (args,) if isinstance(args, str) else args


def _bulk(value: bytes) -> bytes:
    return b"$%d\r\n%b\r\n" % (len(value), value)


# Packed keys kept: a few hundred bytes each, so at most about half a megabyte whatever the
# number of jobs (packing a job's keys again costs about 1 % of a claim's client work).
PACKED_KEYS_KEPT: Final = 1_024


@functools.lru_cache(maxsize=PACKED_KEYS_KEPT)
def _packed_keys(keys: tuple[str, ...], encoding: str, errors: str) -> bytes:
    """The key count and the keys of a call, packed (a job's keys are the same in every call)."""
    return _bulk(b"%d" % len(keys)) + b"".join(_bulk(key.encode(encoding, errors)) for key in keys)


def pack(
    script: Script, keys: Sequence[str], args: Args, encoding: str = "utf-8", errors: str = "strict"
) -> bytes:
    """``EVALSHA <sha> <number of keys> <keys> <args>`` in Redis's protocol (RESP), its text
    encoded as the client encodes it (``encoding``, ``errors``)."""
    argv = _argv(args)
    head = b"*%d\r\n$7\r\nEVALSHA\r\n" % (3 + len(keys) + len(argv)) + _bulk(script.sha.encode())
    tail = b"".join([_bulk(arg.encode(encoding, errors)) for arg in argv])
    return head + _packed_keys(tuple(keys), encoding, errors) + tail


def _pool(client: Redis | RedisCluster) -> Any:
    """The connection pool a single call may take its connection from (see the module's
    docstring), or None to send it by ``execute_command``: a cluster client (which routes by
    key), a subclass or a single-connection client (which may send commands their own way), a
    client with its own answer callback for EVALSHA, and redis-py before 8 (where the pool's
    and connections' methods differ; 8.2 is the version measured)."""
    import redis
    from redis.asyncio import Redis

    if (
        type(client) is not Redis
        or client.single_connection_client
        or "EVALSHA" in client.response_callbacks
        or int(redis.__version__.split(".")[0]) < 8
    ):
        return None
    return client.connection_pool


async def _exchange(connection: Any, packed: bytes) -> Any:
    await connection.send_packed_command(packed)
    return await connection.read_response()


class ScriptRunner:
    """Calls the scripts on one client (a ``Redis`` or a ``RedisCluster``)."""

    def __init__(self, client: Redis | RedisCluster) -> None:
        self._client = client
        self._pool = _pool(client)
        options = self._pool.connection_kwargs if self._pool is not None else {}
        self._encoding = options.get("encoding", "utf-8")
        self._errors = options.get("encoding_errors", "strict")

    async def load(self) -> None:
        """SCRIPT LOAD every script (redis-py sends it to every primary of a cluster)."""
        for script in SCRIPTS.values():
            sha = text(await self._client.script_load(script.source))
            if sha != script.sha:  # pragma: no cover - Redis computes the same SHA1
                raise RuntimeError(f"Redis answered SHA1 {sha} for script {script.name}")

    async def call(self, name: str, keys: Sequence[str], args: Args) -> Any:
        """Run one script by its SHA1, loading the scripts again if the server lost them."""
        from redis.exceptions import NoScriptError

        script = SCRIPTS[name]
        try:
            return await self._evalsha(script, keys, args)
        except NoScriptError:
            await self.load()
            return await self._evalsha(script, keys, args)

    async def call_one(self, name: str, keys: Sequence[str], args: Args) -> Any:
        """:meth:`call_many` of one call: its answer, or the error reply of its call."""
        from redis.exceptions import ResponseError

        try:
            return await self.call(name, keys, args)
        except ResponseError as exc:
            return exc

    async def call_many(self, name: str, calls: Sequence[Call]) -> list[Any]:
        """Run one script per call in a single pipeline (one round trip); results in order.

        A call that failed has its error in its place (after the calls that met a server
        without the scripts were retried): each call is decided on its own, and a batch is not
        atomic as a whole. A failure of the whole round trip (connection lost) is raised.
        """
        from redis.exceptions import NoScriptError

        if len(calls) == 1:
            return [await self.call_one(name, *calls[0])]

        script = SCRIPTS[name]
        results = await self._pipeline(script, calls)
        missing = [i for i, result in enumerate(results) if isinstance(result, NoScriptError)]
        if missing:
            await self.load()
            retried = await self._pipeline(script, [calls[i] for i in missing])
            for i, result in zip(missing, retried, strict=True):
                results[i] = result
        return results

    def _evalsha(self, script: Script, keys: Sequence[str], args: Args) -> Awaitable[Any]:
        if self._pool is not None:
            return self._sent(pack(script, keys, args, self._encoding, self._errors))
        # The command itself, not client.evalsha(): two calls fewer on every claim.
        return self._client.execute_command("EVALSHA", script.sha, len(keys), *keys, *_argv(args))

    async def _sent(self, packed: bytes) -> Any:
        """Send one packed command on a pooled connection and read its answer, as
        ``Redis.execute_command`` does: the connection's own retries (a connection that failed
        is closed before the next try; a script is safe to run again), the connection back to
        the pool whatever happens (a command cut off mid-way closes its connection)."""
        pool = self._pool
        connection = await pool.get_connection()
        try:
            return await connection.retry.call_with_retry(
                lambda: _exchange(connection, packed), lambda _: connection.disconnect()
            )
        finally:
            await pool.release(connection)

    async def _pipeline(self, script: Script, calls: Sequence[Call]) -> list[Any]:
        pipe = self._client.pipeline(transaction=False)
        for keys, args in calls:
            # Not pipe.evalsha(): a cluster pipeline refuses that method by name, while the
            # command itself is routed by its keys like any other.
            pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *_argv(args))
        return list(await pipe.execute(raise_on_error=False))
