"""The Lua scripts (``*.lua`` next to this module), loaded once and called by their SHA1.

Each script is ``_common.lua`` followed by its own file (``hget_ints.lua`` stands alone).
:class:`ScriptRunner` loads them with SCRIPT LOAD at start (on every primary of a cluster),
calls them with EVALSHA, and loads them again when a server answers NOSCRIPT (it restarted, or
a failover promoted a replica that never saw them). Batches go out as one pipeline: one round
trip for many jobs' claims, each claim its own script call on its own job's keys, so a cluster
routes each to the node of its slot.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Any, Final

from ._rows import text

if TYPE_CHECKING:
    from redis.asyncio import Redis
    from redis.asyncio.cluster import RedisCluster

__all__ = ["SCRIPTS", "Args", "Call", "Script", "ScriptRunner"]

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


class ScriptRunner:
    """Calls the scripts on one client (a ``Redis`` or a ``RedisCluster``)."""

    def __init__(self, client: Redis | RedisCluster) -> None:
        self._client = client

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

    async def call_many(self, name: str, calls: Sequence[Call]) -> list[Any]:
        """Run one script per call in a single pipeline (one round trip); results in order.

        A call that failed has its error in its place (after the calls that met a server
        without the scripts were retried): each call is decided on its own, and a batch is not
        atomic as a whole. A failure of the whole round trip (connection lost) is raised.
        """
        from redis.exceptions import NoScriptError, ResponseError

        if len(calls) == 1:
            keys, args = calls[0]
            try:
                return [await self.call(name, keys, args)]
            except ResponseError as exc:
                return [exc]

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
        # The command itself, not client.evalsha(): two calls fewer on every claim.
        return self._client.execute_command("EVALSHA", script.sha, len(keys), *keys, *_argv(args))

    async def _pipeline(self, script: Script, calls: Sequence[Call]) -> list[Any]:
        pipe = self._client.pipeline(transaction=False)
        for keys, args in calls:
            # Not pipe.evalsha(): a cluster pipeline refuses that method by name, while the
            # command itself is routed by its keys like any other.
            pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *_argv(args))
        return list(await pipe.execute(raise_on_error=False))
