"""The Lua scripts (``*.lua`` next to this module): one function library on Redis >= 7, else
scripts called by their SHA1.

Each script is ``_common.lua`` followed by its own file (``hget_ints.lua`` and
``open_runs.lua`` stand alone; ``_records.lua``, reading stored records by id, goes before
``history.lua`` and ``open_runs.lua``): its helpers, and ``main()``, its work, which ``begin()``
prepares (the call's keys, arguments and clock). :class:`ScriptRunner` loads them at start as the
function library :data:`LIBRARY` (FUNCTION LOAD; Redis runs a library's text once, so an FCALL
runs only ``begin`` and ``main``, where an EVALSHA runs the whole text, defining every helper
again: about 4 us of the server's time per claim) and calls them with FCALL. Where the server has
no functions (Redis < 7), the user may not load them (ACL) or the client is a cluster's, it loads
them with SCRIPT LOAD (on every primary of a cluster) and calls them with EVALSHA. A server that
lost them (it restarted, or a failover promoted a replica that never saw the scripts) answers
NOSCRIPT or "Function not found", and they are loaded again and the call repeated. Batches go out
as one pipeline: one round trip for many jobs' claims, each claim its own script call on its own
job's keys, so a cluster routes each to the node of its slot.

A single call on a plain client (one server, or a Sentinel's primary) is written in Redis's
protocol here (:func:`pack`: a job's keys are packed once) and goes to one of the client's pooled
connections as ``Redis.execute_command`` sends a command (the connection's retries, the pool's
checks), without redis-py packing each argument in Python: that packing was a third of a
claim's client instructions (callgrind, redis-py 8.2). On a plain ``ConnectionPool`` of
:data:`LANE_MIN_POOL` connections or more, single calls keep one of its connections (the lane,
:meth:`ScriptRunner._sent`) instead of taking one and giving it back per call.
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

__all__ = ["LIBRARY", "SCRIPTS", "Args", "Call", "Script", "ScriptRunner", "pack"]

NAMES: Final = ("claim", "renew", "release", "take_over", "finish", "history")
# Scripts that stand alone: _common.lua decodes ARGV[1] as JSON and names one job's keys.
PLAIN_NAMES: Final = ("hget_ints", "open_runs")
# Scripts that read stored records by id: _records.lua goes before their own file.
READS_RECORDS: Final = frozenset({"history", "open_runs"})

# A script's arguments: one JSON string (ARGV[1]), or several strings (ARGV[1], ARGV[2] ...).
Args = str | Sequence[str]
# A call: (the job's keys, the arguments).
Call = tuple[Sequence[str], Args]


# Scripts that only read: a function library flags them no-writes (Redis then runs them while
# memory is full, as it runs an EVAL script until its first deny-OOM write).
READ_ONLY: Final = frozenset({"history", "hget_ints", "open_runs"})


@dataclass(frozen=True, slots=True)
class Script:
    """One script: its EVAL source and the SHA1 Redis knows it by, its function's name in
    :data:`LIBRARY`."""

    name: str
    source: str
    sha: str
    function: str


def _read(filename: str) -> str:
    return resources.files(__package__ or __name__).joinpath(filename).read_text(encoding="utf-8")


# An EVAL script: KEYS and ARGV are globals there, which _common.lua's locals of those names hide.
_EVAL: Final = (
    "local CALL_KEYS, CALL_ARGV = KEYS, ARGV\n{body}\nbegin(CALL_KEYS, CALL_ARGV)\nreturn main()\n"
)
# A function of the library: the body is run once, when the library is loaded.
_FUNCTION: Final = (
    "{body}\nlocal function called(keys, argv)\n  begin(keys, argv)\n  return main()\nend\n"
)
# A script that stands alone, as a function.
_PLAIN_FUNCTION: Final = "local function called(KEYS, ARGV)\n{body}end\n"
# Each function in a block of its own, so its locals (its own copy of _common.lua's) end there.
_REGISTER: Final = (
    "do\n{block}redis.register_function{{function_name='{function}', callback=called,\n"
    "  flags={{{flags}}}}}\nend\n"
)


def _build() -> tuple[dict[str, Script], str]:
    """The scripts, and the function library holding them all (Redis >= 7), named after its
    code so that two versions of anarchon on one server keep a library each."""
    common, records = _read("_common.lua"), _read("_records.lua")

    def own(name: str) -> str:
        source = f"-- {name}.lua\n{_read(f'{name}.lua')}"
        return f"{records}\n{source}" if name in READS_RECORDS else source

    sources, blocks = {}, {}
    for name in NAMES:
        body = f"{common}\n{own(name)}"
        sources[name] = _EVAL.format(body=body)
        blocks[name] = _FUNCTION.format(body=body)
    for name in PLAIN_NAMES:
        sources[name] = body = own(name)
        blocks[name] = _PLAIN_FUNCTION.format(body=body)
    lib = hashlib.sha1("".join(sources.values()).encode()).hexdigest()[:16]
    library = [f"#!lua name=anarchon_{lib}\n"]
    scripts = {}
    for name, source in sources.items():
        function = f"anarchon_{lib}_{name}"
        flags = "'no-writes'" if name in READ_ONLY else ""
        library.append(_REGISTER.format(block=blocks[name], function=function, flags=flags))
        scripts[name] = Script(name, source, hashlib.sha1(source.encode()).hexdigest(), function)
    return scripts, "".join(library)


SCRIPTS, LIBRARY = _build()


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
    script: Script,
    keys: Sequence[str],
    args: Args,
    encoding: str = "utf-8",
    errors: str = "strict",
    *,
    function: bool = False,
) -> bytes:
    """``EVALSHA <sha> <number of keys> <keys> <args>`` (``FCALL <function> ...`` if
    ``function``) in Redis's protocol (RESP), its text encoded as the client encodes it
    (``encoding``, ``errors``)."""
    argv = _argv(args)
    count = 3 + len(keys) + len(argv)
    head = _COUNTS[count] if count < len(_COUNTS) else b"*%d\r\n" % count
    command = _HEADS[function][script.name]
    packed_keys = _packed_keys(tuple(keys), encoding, errors)
    # The arguments written as text and encoded once: each argument's length in characters is
    # its length in bytes when the whole text is ASCII (JSON with ASCII names, as a claim's
    # usually is) and the encoding writes ASCII as ASCII. Half this function's cost otherwise
    # (a bytes format and an encode per argument).
    tail = ""
    for arg in argv:
        tail += f"${len(arg)}\r\n{arg}\r\n"
    if tail.isascii() and encoding in _WRITES_ASCII:
        return b"".join((head, command, packed_keys, tail.encode()))
    tail_bytes = b"".join([_bulk(arg.encode(encoding, errors)) for arg in argv])
    return b"".join((head, command, packed_keys, tail_bytes))


# Encodings that write ASCII text as ASCII, under the names redis-py's users give them (any
# other takes the slower way, which is right for every encoding).
_WRITES_ASCII: Final = frozenset({"utf-8", "utf8", "UTF-8", "ascii", "latin-1", "latin1"})
# A command's length header for the usual lengths (a bytes format costs more than the lookup).
_COUNTS: Final = tuple(b"*%d\r\n" % n for n in range(32))


def _heads(function: bool) -> dict[str, bytes]:
    """The command and script of a call of each script, packed: ``FCALL <function>`` or
    ``EVALSHA <sha>``."""
    if function:
        return {n: b"$5\r\nFCALL\r\n" + _bulk(s.function.encode()) for n, s in SCRIPTS.items()}
    return {n: b"$7\r\nEVALSHA\r\n" + _bulk(s.sha.encode()) for n, s in SCRIPTS.items()}


# By function (FCALL or EVALSHA), then by script name: two dict lookups per call (a cache keyed
# by the Script itself hashed the dataclass in Python at every call).
_HEADS: Final = {True: _heads(True), False: _heads(False)}


# Error replies that say the server lacks the function called, or functions altogether (a
# failover or a restart onto a Redis before 7: the scripts are loaded for EVALSHA then).
_NO_FUNCTION: Final = ("Function not found", "unknown command 'FCALL'")


def _missing(answer: object) -> bool:
    """Whether ``answer`` (an error) says the server lacks the script or function called."""
    from redis.exceptions import NoScriptError, ResponseError

    return isinstance(answer, NoScriptError) or (
        isinstance(answer, ResponseError) and str(answer).startswith(_NO_FUNCTION)
    )


def _pool(client: Redis | RedisCluster) -> Any:
    """The connection pool a single call may take its connection from (see the module's
    docstring), or None to send it by ``execute_command``: a cluster client (which routes by
    key), a subclass or a single-connection client (which may send commands their own way), a
    client with its own answer callback for EVALSHA or FCALL, and redis-py before 8 (where the
    pool's and connections' methods differ; 8.2 is the version measured)."""
    import redis
    from redis.asyncio import Redis

    if (
        type(client) is not Redis
        or client.single_connection_client
        or {"EVALSHA", "FCALL"} & client.response_callbacks.keys()
        or int(redis.__version__.split(".")[0]) < 8
    ):
        return None
    return client.connection_pool


# A lane is kept only from a pool that allows at least this many connections (redis-py's
# default: 100), so that the one it holds never leaves a small pool short.
LANE_MIN_POOL: Final = 10


def _may_keep_lane(pool: Any) -> bool:
    """Whether single calls may keep a connection of ``pool`` (see :meth:`ScriptRunner._sent`):
    a plain ``ConnectionPool`` (not a blocking one, nor a Sentinel's, which finds the primary
    again per connection) allowing :data:`LANE_MIN_POOL` connections or more."""
    from redis.asyncio import ConnectionPool

    return type(pool) is ConnectionPool and pool.max_connections >= LANE_MIN_POOL


async def _exchange(connection: Any, packed: bytes) -> Any:
    await connection.send_packed_command(packed)
    return await connection.read_response()


class ScriptRunner:
    """Calls the scripts on one client (a ``Redis`` or a ``RedisCluster``)."""

    def __init__(self, client: Redis | RedisCluster) -> None:
        from redis.asyncio.cluster import RedisCluster
        from redis.exceptions import ResponseError

        self._response_error = ResponseError
        self._client = client
        self._pool = _pool(client)
        options = self._pool.connection_kwargs if self._pool is not None else {}
        self._encoding = options.get("encoding", "utf-8")
        self._errors = options.get("encoding_errors", "strict")
        # Functions only on one server: a cluster keeps EVALSHA (SCRIPT LOAD on every primary).
        self._may_load_functions = not isinstance(client, RedisCluster)
        #: Whether the scripts are called as functions (FCALL), decided by :meth:`load`.
        self.functions = False
        # The lane: one connection of the pool kept for single calls (see _sent).
        self._lane: Any = None
        self._lane_busy = False
        self._may_keep_lane = _may_keep_lane(self._pool)

    async def load(self) -> None:
        """Load the scripts: the function library (``FUNCTION LOAD``, Redis >= 7; a library of
        that name holds this code already), else (an older server, a user whose ACL refuses
        ``FUNCTION``, a cluster) ``SCRIPT LOAD`` of every script (redis-py sends it to every
        primary of a cluster)."""
        self.functions = self._may_load_functions and await self._load_library()
        if self.functions:
            return
        for script in SCRIPTS.values():
            sha = text(await self._client.script_load(script.source))
            if sha != script.sha:  # pragma: no cover - Redis computes the same SHA1
                raise RuntimeError(f"Redis answered SHA1 {sha} for script {script.name}")

    async def _load_library(self) -> bool:
        """Whether the server holds :data:`LIBRARY` (loaded now, or before: not replaced, which
        would cost the server about a millisecond of compiling)."""
        from redis.exceptions import ResponseError

        try:
            await self._client.execute_command("FUNCTION", "LOAD", LIBRARY)
        except ResponseError as exc:
            return "already exists" in str(exc)
        return True

    async def call(self, name: str, keys: Sequence[str], args: Args) -> Any:
        """Run one script, loading the scripts again if the server lost them."""
        answer = await self.call_one(name, keys, args)
        if isinstance(answer, self._response_error):
            raise answer
        return answer

    async def call_one(self, name: str, keys: Sequence[str], args: Args) -> Any:
        """:meth:`call_many` of one call: its answer, or the error reply of its call (after
        loading the scripts again if the server lost them)."""
        script = SCRIPTS[name]
        response_error = self._response_error  # imported once: an import per call costs 1 us
        try:
            return await self._send(script, keys, args)
        except response_error as exc:
            if not _missing(exc):
                return exc
        try:
            await self.load()
            return await self._send(script, keys, args)
        except response_error as exc:
            return exc

    async def call_many(self, name: str, calls: Sequence[Call]) -> list[Any]:
        """Run one script per call in a single pipeline (one round trip); results in order.

        A call that failed has its error in its place (after the calls that met a server
        without the scripts were retried): each call is decided on its own, and a batch is not
        atomic as a whole. A failure of the whole round trip (connection lost) is raised.
        """
        if len(calls) == 1:
            return [await self.call_one(name, *calls[0])]

        script = SCRIPTS[name]
        results = await self._pipeline(script, calls)
        missing = [i for i, result in enumerate(results) if _missing(result)]
        if missing:
            await self.load()
            retried = await self._pipeline(script, [calls[i] for i in missing])
            for i, result in zip(missing, retried, strict=True):
                results[i] = result
        return results

    def _send(self, script: Script, keys: Sequence[str], args: Args) -> Awaitable[Any]:
        if self._pool is not None:
            packed = pack(script, keys, args, self._encoding, self._errors, function=self.functions)
            return self._sent(packed)
        # The command itself, not client.evalsha(): two calls fewer on every claim.
        return self._client.execute_command(*self._command(script), len(keys), *keys, *_argv(args))

    def _command(self, script: Script) -> tuple[str, str]:
        return ("FCALL", script.function) if self.functions else ("EVALSHA", script.sha)

    async def _sent(self, packed: bytes) -> Any:
        """Send one packed command and read its answer: on the lane (a connection of the pool
        this runner keeps, taken at its first single call) while no other call uses it, else
        on a connection of the pool (:meth:`_sent_pooled`). The lane skips the pool's take and
        return (its lock, its checks, redis-py's connection counts and events: about 65 000
        of a claim's 410 000 instructions) and is used as the pool would use it: the
        connection's own retries, each closing the connection that failed; a command cut off
        mid-way (a time limit, a cancelled caller) closes it too, so the next call connects
        again and never reads a late answer."""
        if self._lane_busy or not self._may_keep_lane:
            return await self._sent_pooled(packed)
        self._lane_busy = True
        try:
            lane = self._lane
            if lane is None:
                lane = self._lane = await self._pool.get_connection()
            elif lane.should_reconnect():
                # Marked by redis-py's maintenance notifications, as the pool closes such a
                # connection when it comes back.
                await lane.disconnect()
            return await lane.retry.call_with_retry(
                lambda: _exchange(lane, packed), lambda _: lane.disconnect()
            )
        finally:
            self._lane_busy = False
            if not self._may_keep_lane:  # released while this call used it
                await self.release_lane()

    async def release_lane(self) -> None:
        """Give the lane back to the pool (at close; the client goes on without it): now, or
        when the call that uses it ends. Later single calls take pooled connections."""
        self._may_keep_lane = False
        if self._lane_busy:
            return
        lane, self._lane = self._lane, None
        if lane is None:
            return
        try:
            await self._pool.release(lane)
        except KeyError:  # the pool no longer knows it (someone reset the pool): close it here
            await lane.disconnect()

    async def _sent_pooled(self, packed: bytes) -> Any:
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
        command = self._command(script)
        for keys, args in calls:
            # Not pipe.evalsha(): a cluster pipeline refuses that method by name, while the
            # command itself is routed by its keys like any other.
            pipe.execute_command(*command, len(keys), *keys, *_argv(args))
        return list(await pipe.execute(raise_on_error=False))
