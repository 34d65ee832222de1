"""The scripts as a Redis 7 function library (FUNCTION LOAD, FCALL), on private servers: loaded
at start and again after the server lost it, and EVALSHA where the server has no functions (an
older Redis: FUNCTION unknown) or the user may not load them (ACL)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from anarchon import BackendUnavailable
from anarchon.backend import ClaimStatus
from anarchon.backends.redis import RedisBackend, _connection
from anarchon.backends.redis._scripts import LIBRARY, SCRIPTS
from tests.redis.servers import RedisServer, redis_server
from tests.redis.test_faults import settle
from tests.redis.test_scripts import SLOT, claim_request

LIBRARY_NAME = LIBRARY.split("\n", 1)[0].removeprefix("#!lua name=")


async def _calls(url: str) -> dict[str, int]:
    client = Redis.from_url(url)
    try:
        stats = await client.info("commandstats")
    finally:
        await client.aclose()
    return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}


def _fields(flat: list[Any]) -> dict[str, Any]:
    return dict(zip(flat[::2], flat[1::2], strict=True))


@contextlib.asynccontextmanager
async def _started(url: str) -> AsyncIterator[RedisBackend]:
    backend = RedisBackend(url, prefix="fn:")
    await backend.start()
    try:
        yield backend
    finally:
        await backend.stop()


async def _every_call_kind(backend: RedisBackend, job: str, slot: int = SLOT) -> None:
    """A claim alone, a batch (one script call), history and last_slots (hget_ints), each
    answered: four script calls."""
    [one] = await backend.claim([claim_request(job=job, slot=slot)])
    assert one.status is ClaimStatus.WON
    batch = await backend.claim([claim_request(job=f"{job}{n}", slot=slot) for n in range(3)])
    assert [o.status for o in batch] == [ClaimStatus.WON] * 3
    assert [r.slot_ms for r in await backend.history(job)] == [slot]
    assert await backend.last_slots([job, f"{job}-none"]) == {job: slot, f"{job}-none": None}


async def test_on_redis_7_the_scripts_are_one_library_called_by_fcall(
    own_server: RedisServer,
) -> None:
    async with _started(own_server.url) as backend:
        await _every_call_kind(backend, "j")
        calls = await _calls(own_server.url)
        assert calls["fcall"] == 4 and "evalsha" not in calls, calls
        assert "script|load" not in calls, calls
        client = Redis.from_url(own_server.url, decode_responses=True)
        try:
            [library] = await client.function_list(LIBRARY_NAME)
        finally:
            await client.aclose()
        # RESP2: each library and function a flat list of names and values.
        listed = [_fields(f) for f in _fields(library)["functions"]]
        functions = {f["name"]: f["flags"] for f in listed}
        assert functions == {
            s.function: ["no-writes"] if s.name in {"history", "hget_ints", "open_runs"} else []
            for s in SCRIPTS.values()
        }


async def test_functions_are_loaded_again_after_the_server_lost_them(
    own_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """FUNCTION FLUSH (as a restart without persistence leaves the server): every kind of call
    loads the library again and is answered; last_slots in three parts of one pipeline."""
    monkeypatch.setattr(_connection, "HGET_SCRIPT_KEYS", 1)
    async with _started(own_server.url) as backend:
        for n, call in enumerate(("claim", "batch", "history", "last_slots")):
            own_server.cli("FUNCTION", "FLUSH")
            if call == "claim":
                [won] = await backend.claim([claim_request(job="a", slot=SLOT)])
                assert won.status is ClaimStatus.WON
            elif call == "batch":
                batch = await backend.claim([claim_request(job=f"b{k}") for k in range(3)])
                assert [o.status for o in batch] == [ClaimStatus.WON] * 3
            elif call == "history":
                assert len(await backend.history("a")) == 1
            else:
                found = await backend.last_slots(["a", "b0", "none"])
                assert found == {"a": SLOT, "b0": SLOT, "none": None}
            assert LIBRARY_NAME in own_server.cli("FUNCTION", "LIST"), n
        assert "evalsha" not in await _calls(own_server.url)


@pytest.fixture
def server_without_functions(tmp_path: Path) -> Iterator[RedisServer]:
    """A Redis 7 that answers FUNCTION and FCALL as a Redis 6 does: unknown command."""
    with redis_server(
        tmp_path, "--rename-command", "FUNCTION", "", "--rename-command", "FCALL", ""
    ) as server:
        yield server


async def test_a_server_without_functions_gets_evalsha(
    server_without_functions: RedisServer,
) -> None:
    url = server_without_functions.url
    async with _started(url) as backend:
        await _every_call_kind(backend, "j")
        server_without_functions.cli("SCRIPT", "FLUSH")
        [won] = await backend.claim([claim_request(job="k")])
        assert won.status is ClaimStatus.WON
    calls = await _calls(url)
    assert calls["evalsha"] == 6 and "fcall" not in calls, calls


async def test_a_user_refused_function_load_gets_evalsha(own_server: RedisServer) -> None:
    """The page's minimal ACL user loads and calls the library; the same user without FUNCTION
    calls the scripts by EVALSHA."""
    rules = ["on", ">secret", "~fn:*", "&fn:*", "+@read", "+@write", "+@scripting", "+@pubsub"]
    rules += ["+@connection", "-@dangerous", "+info", "+time"]
    own_server.cli("ACL", "SETUSER", "minimal", *rules)
    own_server.cli("ACL", "SETUSER", "nofunction", *rules, "-function")
    server = f"127.0.0.1:{own_server.port}/0"
    for user, command, other in (
        ("minimal", "fcall", "evalsha"),
        ("nofunction", "evalsha", "fcall"),
    ):
        own_server.cli("FUNCTION", "FLUSH")
        own_server.cli("CONFIG", "RESETSTAT")
        async with _started(f"redis://{user}:secret@{server}") as backend:
            await _every_call_kind(backend, user, SLOT + 1000 * len(user))
        calls = await _calls(own_server.url)
        assert calls.get(command) == 4 and other not in calls, (user, calls)


async def test_a_library_already_loaded_is_kept_not_compiled_again(
    own_server: RedisServer,
) -> None:
    """Every start asks FUNCTION LOAD; the second finds the library and keeps it (a REPLACE
    would compile it again, about a millisecond of the server's time each start)."""
    async with _started(own_server.url) as first, _started(own_server.url) as second:
        [won] = await second.claim([claim_request(job="j", slot=SLOT)])
        [lost] = await first.claim([claim_request(job="j", slot=SLOT)])
        assert (won.status, lost.status) == (ClaimStatus.WON, ClaimStatus.LOST)
    client = Redis.from_url(own_server.url)
    try:
        stats = await client.info("commandstats")
    finally:
        await client.aclose()
    load = stats["cmdstat_function|load"]
    assert load["calls"] == 2 and load["failed_calls"] == 1, load


async def test_while_memory_is_full_a_function_that_may_write_is_refused_as_a_whole(
    own_server: RedisServer,
) -> None:
    """A claim that would meet a record is refused like every change (EVALSHA answered it lost:
    its script had not written); the no-writes functions still answer."""
    from tests.redis.test_memory import fill, relieve

    async with _started(own_server.url) as backend:
        [won] = await backend.claim([claim_request(job="j", slot=SLOT)])
        assert won.status is ClaimStatus.WON
        await fill(own_server)
        try:
            with pytest.raises(BackendUnavailable, match="OutOfMemoryError"):
                await backend.claim([claim_request(job="j", slot=SLOT)])
            assert [r.slot_ms for r in await backend.history("j")] == [SLOT]
            assert await backend.last_slots(["j"]) == {"j": SLOT}
        finally:
            await relieve(own_server)
        [lost] = await backend.claim([claim_request(job="j", slot=SLOT)])
        assert lost.status is ClaimStatus.LOST


async def test_the_library_asks_the_uptime_once_and_every_first_record_knows_the_start(
    own_server: RedisServer,
) -> None:
    """Each job's first record holds known_from = the server's start + the restart margin; the
    library asks INFO for it once, not at each job's first claim (fails if asked per job)."""
    from anarchon.backends.redis._keys import Namespace
    from anarchon.backends.redis._timings import RESTART_MARGIN_MS
    from tests.redis.test_faults import server_started_ms

    slot = SLOT + 10_000
    async with _started(own_server.url) as backend:
        outcomes = await backend.claim([claim_request(job=f"k{n}", slot=slot) for n in range(3)])
        outcomes += [(await backend.claim([claim_request(job="k3", slot=slot)]))[0]]
        assert [o.status for o in outcomes] == [ClaimStatus.WON] * 4
    assert (await _calls(own_server.url))["info"] == 1
    started = await server_started_ms(own_server)
    client = Redis.from_url(own_server.url)
    try:
        names = Namespace("fn:")
        known = [await client.hget(names.job(f"k{n}").meta, "known_from") for n in range(4)]
    finally:
        await client.aclose()
    assert len(set(known)) == 1 and known[0] is not None, known
    assert abs(int(known[0]) - (started + RESTART_MARGIN_MS)) <= 1000, (known, started)


async def test_a_client_with_its_own_fcall_callback_keeps_execute_command(
    own_server: RedisServer,
) -> None:
    """Its callback shapes every FCALL answer, which a packed call on a pooled connection would
    skip: such a client sends the scripts by execute_command (fails if only EVALSHA's counts)."""
    from anarchon.backends.redis._scripts import ScriptRunner

    client = Redis.from_url(own_server.url)
    client.set_response_callback("FCALL", lambda answer, **_: answer)  # type: ignore[arg-type]
    try:
        assert ScriptRunner(client)._pool is None
        backend = RedisBackend(client=client, prefix="fn:")
        await backend.start()
        try:
            [won] = await backend.claim([claim_request(job="cb")])
            assert won.status is ClaimStatus.WON
        finally:
            await backend.stop()
    finally:
        await client.aclose()


@pytest.mark.parametrize("key", [None, "manual-req1", 'manual-qu"ote', "manual-caf\u00e9\\"])
async def test_a_claim_that_meets_a_record_finds_it_by_the_key_it_was_sent(
    own_server: RedisServer, key: str | None
) -> None:
    """The claim script looks a slot's record up by the key at the head of its second argument
    without decoding the first; a key that JSON escapes (a quote, non-ASCII, a backslash: a
    triggered run's request id) is decoded instead. Either way: one winner, and the others are
    told its run, alone and in a batch."""
    slot = None if key else SLOT
    async with _started(own_server.url) as a, _started(own_server.url) as b:
        [won] = await a.claim([claim_request(job="j-1", slot=slot, instance="a", key=key)])
        again = claim_request(job="j-1", slot=slot, instance="b", key=key)
        [lost] = await b.claim([again])
        [in_batch, other] = await b.claim([again, claim_request(job="j-2", slot=slot, key=key)])
        assert won.status is ClaimStatus.WON and won.run is not None
        assert (lost.status, in_batch.status) == (ClaimStatus.LOST, ClaimStatus.LOST)
        assert lost.run == in_batch.run == won.run
        assert other.status is ClaimStatus.WON
        [history] = await a.history("j-1")
        assert history == won.run


async def test_a_restart_onto_a_server_without_functions_goes_on_by_evalsha(
    own_server: RedisServer,
) -> None:
    """Started on a Redis 7, the backend calls functions; the server comes back as one that
    answers FCALL as a Redis 6 does (a rollback, a failover onto an older replica): the call is
    answered, by EVALSHA, without a restart of the backend."""
    async with _started(own_server.url) as backend:
        await _every_call_kind(backend, "a")
        own_server.kill()
        own_server.args = ("--rename-command", "FUNCTION", "", "--rename-command", "FCALL", "")
        own_server.start()
        await settle(own_server)
        now = (int(time.time()) + 5) * 1000
        await _every_call_kind(backend, "b", now)
    calls = await _calls(own_server.url)
    assert calls["evalsha"] >= 4 and "fcall" not in calls, calls
