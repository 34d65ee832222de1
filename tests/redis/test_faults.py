"""Faults on a private redis-server: unreachable, killed, restarted without its data, scripts
flushed; the backend fails closed, recovers by itself and never runs a slot it cannot vouch for."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from anarchon import BackendError, BackendUnavailable, InvalidOption, LeaseLost, MissingDependency
from anarchon.backend import ClaimStatus
from anarchon.backends.redis import RedisBackend
from anarchon.backends.redis._errors import translate
from anarchon.backends.redis._timings import CALL_TIMEOUT_S, RESTART_MARGIN_MS
from tests.backends.redis import SERVER
from tests.postgres.proxy import TcpProxy
from tests.redis.servers import RedisServer, free_port, redis_server
from tests.redis.test_scripts import SLOT, claim_request

PREFIX = "fault:"


def now_ms() -> int:
    return time.time_ns() // 1_000_000


async def settle(server: RedisServer) -> None:
    """Wait until slots of "now" are past the server's restart margin (see the claim script)."""
    started = await server_started_ms(server)
    wait = started + RESTART_MARGIN_MS + 1_200 - now_ms()
    if wait > 0:
        await asyncio.sleep(wait / 1000)


async def server_started_ms(server: RedisServer) -> int:
    from redis.asyncio import Redis

    client = Redis.from_url(server.url)
    try:
        info = await client.info("server")
    finally:
        await client.aclose()
    return (int(time.time()) - int(info["uptime_in_seconds"])) * 1000


async def test_unreachable_server_fails_start_quickly() -> None:
    port = free_port()
    backend = RedisBackend(f"redis://127.0.0.1:{port}/0")
    began = time.monotonic()
    with pytest.raises(BackendUnavailable) as caught:
        await backend.start()
    assert time.monotonic() - began < 10
    assert f"127.0.0.1:{port}" in str(caught.value) and "cannot start" in str(caught.value)
    await backend.stop()


@pytest.mark.slow
async def test_restart_without_persistence_fails_closed_and_recovers(
    own_server: RedisServer,
) -> None:
    await settle(own_server)
    backend = RedisBackend(own_server.url, prefix=PREFIX)
    await backend.start()
    try:
        slot = now_ms() - 50  # a slot that just came due
        [won] = await backend.claim([claim_request(slot=slot, lease_ms=10_000)])
        assert won.ticket is not None and won.ticket.fence is not None
        own_server.kill()

        # Down: every call fails closed with BackendUnavailable, and quickly.
        began = time.monotonic()
        for call in (
            backend.claim([claim_request(slot=slot + 1000)]),
            backend.renew(won.ticket),
            backend.history("job"),
            backend.server_time_ms(),
        ):
            with pytest.raises(BackendUnavailable):
                await call
        assert time.monotonic() - began < 20

        own_server.start()
        # The restarted server has forgotten the slot. Another instance retrying its claim
        # must not win it: the server cannot know whether it ran.
        [retried] = await backend.claim([claim_request(slot=slot, instance="late")])
        assert retried.status is ClaimStatus.LOST, retried
        assert retried.run.reason is not None and retried.run.reason.startswith("unknown:")
        # The first runner hears it lost its lease (nobody holds the slot now).
        with pytest.raises(LeaseLost, match="the slot is now at nobody"):
            await backend.renew(won.ticket)

        # Slots after the restart run, with fences above those given before it.
        await settle(own_server)
        [fresh] = await backend.claim([claim_request(slot=now_ms())])
        assert fresh.status is ClaimStatus.WON and fresh.ticket is not None
        assert fresh.ticket.fence is not None and fresh.ticket.fence > won.ticket.fence
    finally:
        await backend.stop()


@pytest.mark.slow
async def test_a_silent_network_fails_calls_within_their_limit(prefix: str) -> None:
    """Packets dropped, connections open: a claim fails after the backend's call limit and a
    renewal after a third of its lease (redis-py is given no socket timeout of its own), and
    once the network flows again every call reads its own answer: a connection whose call was
    abandoned is never used again, or the next call would read the late answer meant for it."""
    proxy = TcpProxy(target=("127.0.0.1", 6379))
    proxy.port = free_port()  # the Redis helper's port range, not PostgreSQL's
    with proxy:
        backend = RedisBackend(f"redis://127.0.0.1:{proxy.port}/0", prefix=prefix)
        await backend.start()
        try:
            slot = now_ms() + 60_000
            [won] = await backend.claim([claim_request("silent", slot, lease_ms=1_500)])
            assert won.ticket is not None
            proxy.hold()
            began = time.monotonic()
            with pytest.raises(BackendUnavailable, match=r"no answer within 0\.5 s"):
                await asyncio.wait_for(backend.renew(won.ticket), 30)
            assert time.monotonic() - began < 0.5 + 2
            began = time.monotonic()
            with pytest.raises(BackendUnavailable, match=f"no answer within {CALL_TIMEOUT_S:g} s"):
                await asyncio.wait_for(
                    backend.claim([claim_request("silent", slot + 1000, instance="i2")]), 30
                )
            assert time.monotonic() - began < CALL_TIMEOUT_S + 2
            proxy.restore()
            deadline = time.monotonic() + 15
            while True:
                try:
                    now = await backend.server_time_ms()
                    break
                except BackendUnavailable:
                    assert time.monotonic() < deadline, "the backend did not recover"
                    await asyncio.sleep(0.2)
            assert now is not None and abs(now - now_ms()) < 5_000
            # Each answer is the one asked for (the held renewal and claim may have run late).
            [other] = await backend.claim([claim_request("silent", slot + 2000, instance="i3")])
            assert other.status is ClaimStatus.WON and other.run.instance == "i3"
            assert other.run.slot_ms == slot + 2000
            [first] = await backend.claim([claim_request("silent", slot, instance="i4")])
            assert first.status is ClaimStatus.LOST and first.run.run_id == won.run.run_id
        finally:
            await backend.stop()


async def test_an_outage_is_logged_once_and_so_is_the_recovery(
    own_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Every call fails while Redis is down, but the log says so once (backend_unavailable)
    and once more when Redis answers again (backend_recovered)."""
    backend = RedisBackend(own_server.url, prefix=PREFIX)
    await backend.start()
    try:
        with caplog.at_level(logging.INFO, logger="anarchon.backends.redis"):
            await backend.server_time_ms()
            own_server.kill()
            for _ in range(3):
                with pytest.raises(BackendUnavailable):
                    await backend.history("job")
            with pytest.raises(BackendUnavailable):
                await backend.claim([claim_request(slot=None)])
            own_server.start()
            for _ in range(3):
                assert await backend.server_time_ms() is not None
    finally:
        await backend.stop()
    outage = [
        (getattr(r, "action", None), r.levelno)
        for r in caplog.records
        if str(getattr(r, "action", "")).startswith("backend_")
    ]
    # Both WARNING, as on every backend (the recovery was INFO on Redis alone).
    assert outage == [
        ("backend_unavailable", logging.WARNING),
        ("backend_recovered", logging.WARNING),
    ], caplog.text
    assert all(r.name == "anarchon.backends.redis" for r in caplog.records)


async def test_a_claim_after_the_server_closed_its_connections_is_decided(
    own_server: RedisServer,
) -> None:
    """A single claim goes out on a pooled connection (see _scripts); one the server closed
    meanwhile is replaced, as for any redis-py command, and the claim is decided."""
    backend = RedisBackend(own_server.url, prefix=PREFIX)
    await backend.start()
    try:
        await settle(own_server)
        slot = now_ms() // 1000 * 1000
        [first] = await backend.claim([claim_request(job="killed", slot=slot)])
        assert first.status is ClaimStatus.WON
        own_server.cli("CLIENT", "KILL", "TYPE", "normal")
        [second] = await backend.claim([claim_request(job="killed", slot=slot + 1000)])
        assert second.status is ClaimStatus.WON
    finally:
        await backend.stop()


async def test_scripts_are_loaded_again_after_script_flush(own_server: RedisServer) -> None:
    backend = RedisBackend(own_server.url, prefix=PREFIX)
    await backend.start()
    try:
        own_server.cli("SCRIPT", "FLUSH")
        [one] = await backend.claim([claim_request(slot=None)])
        assert one.status is ClaimStatus.WON
        own_server.cli("SCRIPT", "FLUSH")
        batch = await backend.claim([claim_request(job=f"j{n}", slot=None) for n in range(5)])
        assert [o.status for o in batch] == [ClaimStatus.WON] * 5
        own_server.cli("SCRIPT", "FLUSH")
        assert len(await backend.history("job")) == 1
        own_server.cli("SCRIPT", "FLUSH")
        assert await backend.last_slots(["j0", "none"]) == {"j0": None, "none": None}
    finally:
        await backend.stop()


async def test_last_slots_in_parts_load_the_script_again_after_script_flush(
    own_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three parts of the hget_ints script in one pipeline: each answered in order, after the
    server lost the scripts too (fails if a part is dropped, reordered or left unloaded)."""
    from anarchon.backends.redis import _connection

    monkeypatch.setattr(_connection, "HGET_SCRIPT_KEYS", 3)
    backend = RedisBackend(own_server.url, prefix=PREFIX)
    await backend.start()
    try:
        jobs = [f"j{n}" for n in range(8)]
        slots = {j: SLOT + 1000 * n for n, j in enumerate(jobs) if n % 3 != 1}
        await backend.claim([claim_request(job=j, slot=s) for j, s in slots.items()])
        expected = {j: slots.get(j) for j in jobs}
        assert await backend.last_slots(jobs) == expected
        own_server.cli("SCRIPT", "FLUSH")
        assert await backend.last_slots(jobs) == expected
    finally:
        await backend.stop()


@pytest.mark.slow
async def test_notifications_resume_after_a_restart(
    own_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="anarchon.backends.redis")
    listener = RedisBackend(own_server.url, prefix=PREFIX)
    other = RedisBackend(own_server.url, prefix=PREFIX)
    await listener.start()
    await other.start()
    heard: asyncio.Queue[tuple[str, str, bool]] = asyncio.Queue()
    try:
        await listener.subscribe(lambda job, key, released: heard.put_nowait((job, key, released)))

        async def release_and_hear(wait_s: float) -> float:
            [won] = await other.claim([claim_request(slot=None, lease_ms=30_000)])
            assert won.ticket is not None
            sent = time.monotonic()
            await other.release(won.ticket, "handed over")
            got = await asyncio.wait_for(heard.get(), wait_s)
            assert got == ("job", won.ticket.slot_key, True)
            return time.monotonic() - sent

        assert await release_and_hear(5) < 1.0
        own_server.kill()
        await asyncio.sleep(0.5)
        own_server.start()
        restarted = time.monotonic()
        # Messages published before the listener re-subscribes are lost (by design: backups
        # then act at lease expiry); keep releasing until one is heard.
        while time.monotonic() - restarted < 15:
            try:
                assert await release_and_hear(0.5) < 0.5
                break
            except (BackendUnavailable, TimeoutError):
                continue
        else:
            raise AssertionError("notifications did not resume within 15 s of the restart")
    finally:
        await listener.stop()
        await other.stop()
    actions = [getattr(r, "action", None) for r in caplog.records]
    assert [a for a in actions if a and a.startswith("notifications_")] == [
        "notifications_lost",
        "notifications_resumed",
    ], caplog.text


async def test_eviction_policy_that_may_drop_records_is_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with redis_server(tmp_path, "--maxmemory-policy", "allkeys-lru") as server:
        backend = RedisBackend(server.url, prefix=PREFIX)
        with caplog.at_level(logging.WARNING, logger="anarchon.backends.redis"):
            await backend.start()
        await backend.stop()
    assert any("allkeys-lru" in r.getMessage() for r in caplog.records), caplog.text


async def test_own_client_is_closed_and_a_given_client_is_not(own_server: RedisServer) -> None:
    from redis.asyncio import Redis

    def connections() -> int:
        listed = own_server.cli("CLIENT", "LIST").splitlines()
        return sum(1 for line in listed if "cmd=client" not in line)

    backend = RedisBackend(own_server.url, prefix=PREFIX)
    await backend.start()
    await backend.subscribe(lambda job, key, released: None)
    await backend.history("job")
    assert connections() >= 2
    await backend.stop()
    assert connections() == 0

    client = Redis.from_url(own_server.url)
    given = RedisBackend(client=client, prefix=PREFIX)
    await given.start()
    await given.subscribe(lambda job, key, released: None)
    await given.stop()
    assert await client.ping()  # still usable: it is the caller's
    await client.aclose()


async def test_a_call_in_flight_when_the_backend_stops_leaves_no_connection_open(
    own_server: RedisServer,
) -> None:
    """A call still waiting for its answer when stop() closes the client (a run_now() reading
    history as its scheduler stops): its connection is closed under it and redis-py retries it
    on a new one, which the call then gave back to the closed pool, open. Only the garbage
    collector closed it, with a ResourceWarning in whatever test it ran in. stop() now waits
    for such calls (at most their limit) and closes what they give back."""
    import os
    import signal

    def connections() -> int:
        listed = own_server.cli("CLIENT", "LIST").splitlines()
        return sum(1 for line in listed if "cmd=client" not in line)

    backend = RedisBackend(own_server.url, prefix=PREFIX)  # every option at its default
    await backend.start()
    pool = backend._connection.client().connection_pool  # type: ignore[union-attr]
    assert own_server.proc is not None
    pid = own_server.proc.pid
    os.kill(pid, signal.SIGSTOP)  # the call's answer waits until SIGCONT
    try:
        reading = asyncio.ensure_future(backend.history("job"))
        await asyncio.sleep(0.3)
        assert not reading.done()
        asyncio.get_running_loop().call_later(0.5, os.kill, pid, signal.SIGCONT)
        await backend.stop()
        assert await reading == []  # answered after its retry, on a new connection
        assert connections() == 0
    finally:
        os.kill(pid, signal.SIGCONT)
        await pool.disconnect()  # what the old code left open, closed before the GC finds it


async def test_close_returns_at_once_when_no_call_is_in_flight() -> None:
    """stop() waits for calls in flight only: after calls that answered, failed or were
    cancelled, none is in flight and it returns at once (every option at its default)."""
    backend = RedisBackend(SERVER, prefix=f"fault:{uuid.uuid4().hex[:8]}:")
    await backend.start()
    connection = backend._connection
    assert await backend.history("job") == []
    cancelled = asyncio.ensure_future(backend.history("job"))
    await asyncio.sleep(0)
    assert connection._in_flight == 1  # waiting for its answer
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    with pytest.raises(BackendError):
        await connection.call(connection.client().execute_command("NO-SUCH-COMMAND"))
    assert connection._in_flight == 0
    began = time.monotonic()
    await backend.stop()
    assert time.monotonic() - began < 0.5
    assert connection._idle is None


@pytest.mark.parametrize("query", ["", "?socket_timeout=10"], ids=["inline", "task"])
async def test_close_waits_for_a_call_in_flight_at_most_its_limit(
    own_server: RedisServer, monkeypatch: pytest.MonkeyPatch, query: str
) -> None:
    """stop() waits for a call in flight until it answers, and for CLOSE_CALLS_WAIT_S at most
    (a private server stopped by SIGSTOP holds the answer): a call in the caller's task (every
    option at its default) and one in a task of its own (a socket_timeout)."""
    import os
    import signal

    from anarchon.backends.redis import _timings

    assert own_server.proc is not None
    pid = own_server.proc.pid
    loop = asyncio.get_running_loop()

    async def stop_while_reading(answer_after_s: float) -> tuple[float, asyncio.Future[Any]]:
        backend = RedisBackend(own_server.url + query, prefix=PREFIX)
        await backend.start()
        assert backend._connection._inline == (not query)
        pools.append(backend._connection.client().connection_pool)  # type: ignore[union-attr]
        os.kill(pid, signal.SIGSTOP)
        reading = asyncio.ensure_future(backend.history("job"))
        await asyncio.sleep(0.2)
        loop.call_later(answer_after_s, os.kill, pid, signal.SIGCONT)
        began = time.monotonic()
        await backend.stop()
        return time.monotonic() - began, reading

    pools: list[Any] = []
    try:
        waited, reading = await stop_while_reading(0.6)
        assert reading.done() and 0.5 < waited < 2.0  # close() waited until it answered
        assert reading.result() == []
        monkeypatch.setattr(_timings, "CLOSE_CALLS_WAIT_S", 0.3)
        waited, reading = await stop_while_reading(1.5)
        assert not reading.done() and 0.25 < waited < 1.0  # no longer than its limit
        assert await reading == []  # its connection, given back open, is closed below
    finally:
        os.kill(pid, signal.SIGCONT)
        for pool in pools:
            await pool.disconnect()


async def test_a_call_whose_caller_gave_up_stays_in_flight_until_its_task_ends() -> None:
    """A call in a task of its own (a client with a socket_timeout) whose limit passed, while
    the driver swallowed the cancellation (as redis-py may on Python 3.11), still holds its
    connection: close() waits for its task, then closes the pool's connections again."""
    from anarchon.backends.redis._connection import Connection

    class Pool:
        disconnected = 0

        async def disconnect(self) -> None:
            self.disconnected += 1

    answer = asyncio.Event()

    async def stubborn() -> str:
        while True:
            try:
                await answer.wait()
                return "late"
            except asyncio.CancelledError:
                continue

    connection = Connection("test", lambda: None)  # type: ignore[arg-type, return-value]
    try:
        with pytest.raises(BackendUnavailable, match="no answer"):
            await connection.call(stubborn(), timeout_s=0.05)
        assert connection._in_flight == 1
        asyncio.get_running_loop().call_later(0.2, answer.set)
        pool = Pool()
        began = time.monotonic()
        await connection._close_after_calls(pool)
        assert 0.1 < time.monotonic() - began < 1.0
        assert connection._in_flight == 0 and pool.disconnected == 1
    finally:
        answer.set()  # the stubborn task ends, whatever failed


def test_url_options() -> None:
    backend = RedisBackend.from_url("redis://127.0.0.1:6379/2?prefix=app%3A&history_size=7")
    assert backend.prefix == "app:" and backend.history_size == 7
    assert backend.url == "redis://127.0.0.1:6379/2"
    kept = RedisBackend.from_url("rediss://u:secret@h:6380/0?prefix=x:&ssl_cert_reqs=none")
    assert kept.url == "rediss://u:secret@h:6380/0?ssl_cert_reqs=none"
    assert "secret" not in repr(kept) and "***" in repr(kept)
    with pytest.raises(InvalidOption, match="history_size='lots' in the backend URL"):
        RedisBackend.from_url("redis://h/0?history_size=lots")
    with pytest.raises(InvalidOption, match="'prefix' twice"):
        RedisBackend.from_url("redis://h/0?prefix=a:&prefix=b:")
    with pytest.raises(InvalidOption, match="prefix"):
        RedisBackend.from_url("redis://h/0?prefix=no-colon")
    with pytest.raises(InvalidOption, match="from_url"):
        RedisBackend("redis://h/0?prefix=app:")
    with pytest.raises(InvalidOption, match="not valid"):
        RedisBackend("http://h/0")
    with pytest.raises(InvalidOption, match="history_size"):
        RedisBackend(history_size=0)
    with pytest.raises(InvalidOption, match="not a redis"):
        RedisBackend(client=object())  # type: ignore[arg-type]


async def test_both_url_and_client_are_refused() -> None:
    from redis.asyncio import Redis

    client = Redis.from_url(SERVER)
    try:
        with pytest.raises(InvalidOption, match="pass one of them"):
            RedisBackend("redis://other:6379/0", client=client)
    finally:
        await client.aclose()


def test_an_option_redis_py_does_not_take_is_refused_when_the_backend_is_made() -> None:
    # redis-py hands any query option to its connection class, which refused it only when the
    # first connection was made: at start(), or at the CLI's first read ("cannot reach").
    for url in (f"{SERVER}?prefix=x:&no_such_option=1", "rediss://u:pw@h:6380/0?no_such_option=1"):
        with pytest.raises(InvalidOption) as caught:
            RedisBackend.from_url(url)
        assert "does not take: no_such_option" in str(caught.value)
        assert "prefix and history_size" in str(caught.value) and "pw" not in str(caught.value)
    with pytest.raises(InvalidOption, match="does not take: typo_timeout"):
        RedisBackend(f"{SERVER}?socket_timeout=2&typo_timeout=3")
    with pytest.raises(InvalidOption, match="socket_timeout"):
        RedisBackend(f"{SERVER}?socket_timeout=soon")
    # What every connection class takes is taken: TCP, TLS and a Unix socket.
    assert RedisBackend.from_url(f"{SERVER}?socket_timeout=2&health_check_interval=5")
    assert RedisBackend("rediss://h:6380/0?ssl_cert_reqs=none&ssl_check_hostname=false")
    assert RedisBackend("unix:///run/redis.sock?db=3&socket_timeout=2")


def test_backend_from_url_reaches_redis() -> None:
    from anarchon import backend_from_url

    backend = backend_from_url("redis://127.0.0.1:6379/0?prefix=via-url:")
    assert isinstance(backend, RedisBackend) and backend.prefix == "via-url:"


@pytest.mark.parametrize(
    ("query", "inline"),
    [("", True), ("&socket_timeout=5", False)],
)
async def test_calls_run_in_the_callers_task_only_without_a_socket_timeout(
    query: str, inline: bool
) -> None:
    """redis-py sends a command through asyncio.wait_for when a socket timeout is set, which
    can swallow a cancellation: such a client's calls keep a task of their own."""
    backend = RedisBackend.from_url(f"{SERVER}?prefix=inline:{query}")
    await backend.start()
    try:
        assert backend._connection._inline is inline
        assert await backend.last_slots(["inline-job"]) == {"inline-job": None}
    finally:
        await backend.stop()


def test_module_imports_without_the_driver_and_construction_names_the_extra() -> None:
    code = (
        "import sys; sys.modules['redis'] = None\n"
        "from anarchon.backends.redis import RedisBackend\n"
        "from anarchon import MissingDependency\n"
        "try:\n    RedisBackend()\nexcept MissingDependency as exc:\n    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "pip install 'anarchon[redis]'" in out.stdout
    assert issubclass(MissingDependency, ImportError)


def test_driver_errors_are_translated() -> None:
    import redis.exceptions as rx

    transient = [
        rx.ConnectionError("refused"),
        rx.TimeoutError("slow"),
        rx.BusyLoadingError("loading"),
        rx.ClusterDownError("down"),
        rx.TryAgainError("again"),
        rx.ReadOnlyError("replica"),
        rx.ResponseError("BUSY Redis is busy running a script"),
        rx.ResponseError("MISCONF cannot persist"),
        ConnectionResetError("reset"),
    ]
    for exc in transient:
        assert type(translate(exc, "x")) is BackendUnavailable, exc
    permanent = [
        rx.AuthenticationError("bad password"),
        rx.NoPermissionError("acl"),
        rx.ResponseError("ERR Error running script"),
    ]
    for exc in permanent:
        error = translate(exc, "redis://h")
        assert type(error) is BackendError and "redis://h" in str(error), exc


def test_a_wrapped_tls_error_keeps_its_words() -> None:
    """redis-py 5 wraps a certificate that does not verify as ``Error 1 connecting to h:6380.
    1.``; the translation adds the TLS error's own words (redis-py 8 has them already)."""
    import ssl

    import redis.exceptions as rx

    reason = "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: self-signed certificate"
    for message in ("Error 1 connecting to h:6380. 1.", f"Error 1 connecting to h:6380. {reason}."):
        try:
            try:
                raise ssl.SSLCertVerificationError(1, reason)
            except OSError as inner:
                raise rx.ConnectionError(message) from inner
        except rx.ConnectionError as exc:
            error = translate(exc, "rediss://h:6380")
        assert type(error) is BackendUnavailable
        assert str(error).count("CERTIFICATE_VERIFY_FAILED") == 1, error
    # Where redis-py's message has the words already, nothing is added.
    refused = "Connect call failed ('h', 6379)"
    try:
        try:
            raise ConnectionRefusedError(111, refused)
        except OSError:
            # As redis-py raises it: the OSError is the context, not the cause.
            raise rx.ConnectionError(f"Error 111 connecting to h:6379. {refused}.")  # noqa: B904
    except rx.ConnectionError as exc:
        error = translate(exc, "redis://h:6379")
    assert (
        str(error)
        == f"Redis redis://h:6379: ConnectionError: Error 111 connecting to h:6379. {refused}."
    )


async def test_a_cancelled_caller_is_cancelled() -> None:
    """Cancelling a task mid-call always cancels it (redis-py can swallow it otherwise)."""
    backend = RedisBackend(SERVER, prefix=f"cancel-{uuid.uuid4().hex[:8]}:")
    await backend.start()
    stuck = 0
    try:
        for n in range(200):

            async def loop() -> None:
                while True:
                    await backend.server_time_ms()
                    await asyncio.sleep(60)

            task = asyncio.ensure_future(loop())
            for _ in range(n % 13):
                await asyncio.sleep(0)
            task.cancel()
            done, _ = await asyncio.wait([task], timeout=2)
            if not done:
                stuck += 1
                task.cancel()
                await asyncio.wait([task], timeout=2)
    finally:
        await backend.stop()
    assert stuck == 0


async def test_clones_have_a_client_of_their_own(prefix: str) -> None:
    """clone() (the lease keeper thread's backend) works from a URL and from a plain client
    passed in, closes only the client it made, and is None for a Sentinel client."""
    from redis.asyncio import Redis
    from redis.asyncio.sentinel import Sentinel

    from_url = RedisBackend(SERVER, prefix=prefix, history_size=7).clone()
    assert from_url is not None
    assert (from_url.url, from_url.prefix, from_url.history_size) == (SERVER, prefix, 7)
    client = Redis.from_url(SERVER)
    copied = RedisBackend(client=client, prefix=prefix).clone()
    assert copied is not None and "a copy of" in repr(copied)
    try:
        for twin in (from_url, copied):
            await twin.start()
            assert await twin.server_time_ms() is not None
            await twin.stop()
        assert await client.ping()  # the copy closed its own client, not the one passed in
    finally:
        await client.aclose()
    sentinel = Sentinel([("127.0.0.1", free_port())])  # type: ignore[no-untyped-call, unused-ignore]
    assert RedisBackend(client=sentinel.master_for("mymaster"), prefix=prefix).clone() is None
