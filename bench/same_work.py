"""The same-work floor: each backend's own claim storage work, done by a bare client loop.

A one-request ``Backend.claim`` stores more than the raw primitive (:mod:`bench.primitives`):
the run record, its lease and fence, the overlap and pause checks, the claim notice. Here the
same client library sends exactly what the backend sends for one claim, the way the backend
sends it (client options, protocol, lock waits), with no anarchon code around the call (no
pool, no bounded call, no request or outcome objects), on the backend's own namespace (created
by its ``start()``), so that the claim rate can be split into what the storage work leaves of
the primitive and what anarchon's Python costs on top. Where the backend sends more cleverly
than the primitive's plain loop (no socket timeout, prepared binary statements, short lock
waits, acks on one subscription), the floor can be faster than the primitive:

=========  ===========================================================================  =========
backend    one claim of (job, slot)                                                     client
=========  ===========================================================================  =========
sqlite     the claim transaction's statements (``queries.sql``, as a traced claim       sqlite3
           runs them): ``PRAGMA busy_timeout=0``, ``BEGIN IMMEDIATE`` retried in the
           backend's short steps, ``PRAGMA busy_timeout=<ms>``, ``clock_anchor``,
           ``current``; a loser commits there; a winner then ``pruned_through``,
           ``some_pauses``, ``next_fence``, ``insert`` and commits. One call of a
           one-thread executor per claim, on a connection opened as the backend opens
           its own (WAL, ``synchronous=FULL``)
redis      ``FCALL`` of the backend's claim function (``EVALSHA`` of its claim script    redis-py
           where the backend calls scripts so: Redis < 7, an ACL without
           ``FUNCTION``), loaded as the backend loads them, on the job's five keys and
           the pauses hash, with the three arguments a claim of one request sends (the
           claims channel included, so a winner's script publishes its notice), packed
           by the backend's ``pack`` and sent on one connection of the client's pool
           kept for single calls, as the backend sends a single script call; client
           opened with the backend's ``socket_timeout=None``
postgres   the ``claim_one`` statement (``queries.sql``, one call of the claim          psycopg 3
           function) with the backend's parameters, positional, binary, prepared as
           the backend prepares it, on an autocommit connection; a winner then sends
           ``notify_claim`` with its claim notice (the backend's second round trip,
           with notifications on)
nats       a JetStream publish to ``<prefix><job>.claims`` with ``Nats-Msg-Id:          nats-py
           <job>:<slot>`` and the claim's payload (``encode_claim``'s JSON), its ack
           heard on one subscription as the backend hears it; won unless the ack says
           duplicate. Not included: a loser's read-back of the stored claim (the
           backend's feed of the stream's claims)
=========  ===========================================================================  =========

Script and SQL come from the backend package, so the floor follows the backend; the arguments
are built here, and :meth:`SameWork.check` compares them once, before the loop, with what the
backend's own encoder makes of the same request, so a change of the backend's arguments stops
the measurement instead of measuring something else.
"""

from __future__ import annotations

import abc
import asyncio
import json
import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlsplit

from .primitives import begin_polling

__all__ = ["PostgresClient", "SameWork", "make_same_work", "request_params"]

LEASE_MS = 15_000
"""The lease of the probe's claims (``bench.probe._request``)."""
TRIGGER = "schedule"


class SameWork(abc.ABC):
    """One client doing one backend's claim storage work for one request at a time."""

    def __init__(self, backend: Any, instance: str) -> None:
        self.backend = backend
        self.instance = instance

    async def open(self) -> None:  # noqa: B027 - optional
        """Connect."""

    async def close(self) -> None:  # noqa: B027 - optional
        """Disconnect."""

    @abc.abstractmethod
    async def claim(self, job: str, slot: int, run_id: str, token: str) -> bool:
        """Do one claim's storage work for slot ``slot`` of ``job``; True if this call won it."""

    @abc.abstractmethod
    def check(self, req: Any) -> None:
        """Raise if the arguments built here differ from the backend's own for ``req``
        (a ``ClaimRequest`` of this instance, trigger ``schedule``, overlap allowed)."""


def _differs(what: str, ours: object, theirs: object) -> RuntimeError:
    return RuntimeError(
        f"same-work floor: {what} built by bench/same_work.py {ours!r} differs from the "
        f"backend's {theirs!r}; update bench/same_work.py to follow the backend"
    )


class SQLiteSameWork(SameWork):
    """The SQLite backend's claim transaction, statement by statement."""

    def __init__(self, backend: Any, instance: str) -> None:
        super().__init__(backend, instance)
        from anarchon.backends.sqlite._options import lock_waits
        from anarchon.backends.sqlite._queries import Q
        from anarchon.backends.sqlite._rows import PAUSES_READ_AT_ONCE

        self.path = str(backend.path)
        self.q = Q
        self.pauses_limit = PAUSES_READ_AT_ONCE + 1
        self.lock_waits = lock_waits
        self.busy_s = 10.0
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="same-work-sqlite")
        self._conn: sqlite3.Connection | None = None

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self.path, timeout=self.busy_s, isolation_level=None, check_same_thread=False
        )
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute(f"PRAGMA busy_timeout={int(self.busy_s * 1000)}")
        return conn

    async def open(self) -> None:
        loop = asyncio.get_running_loop()
        self._conn = await loop.run_in_executor(self._thread, self._connect)

    async def close(self) -> None:
        if self._conn is not None:
            await asyncio.get_running_loop().run_in_executor(self._thread, self._conn.close)
        self._thread.shutdown(wait=True)

    def _begin(self, conn: sqlite3.Connection) -> None:
        # As the backend begins (sqlite/_connection.py, _begin): its own short waits, not
        # SQLite's busy handler.
        begin_polling(conn, self.lock_waits(), self.busy_s)

    def _claim(self, job: str, slot: int, run_id: str, token: str) -> bool:
        assert self._conn is not None
        conn, q = self._conn, self.q
        self._begin(conn)
        try:
            conn.execute(q["clock_anchor"]).fetchone()
            now = int(time.time() * 1000)
            slot_key = str(slot)
            found = conn.execute(q["current"], (job, slot_key)).fetchone()
            if found is None:
                conn.execute(q["pruned_through"], (job,)).fetchone()
                conn.execute(q["some_pauses"], (self.pauses_limit,)).fetchall()
                fence = conn.execute(q["next_fence"], {"job": job, "now": now}).fetchone()[0]
                conn.execute(q["insert"], self.row(job, slot, run_id, token, now, fence))
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return found is None or found[5] == token

    def row(
        self, job: str, slot: int, run_id: str, token: str, now: int, fence: int
    ) -> dict[str, Any]:
        """The ``insert`` query's parameters for a won claim (``_rows._params``)."""
        return {
            "job": job,
            "slot_key": str(slot),
            "slot": slot,
            "attempt": 1,
            "run_id": run_id,
            "token": token,
            "instance": self.instance,
            "trigger": TRIGGER,
            "status": "running",
            "fence": fence,
            "started_at": now,
            "finished_at": None,
            "lease_expires_at": now + LEASE_MS,
            "released": 0,
            "error": None,
            "reason": None,
            "requested_by": None,
            "skip_cause": None,
        }

    async def claim(self, job: str, slot: int, run_id: str, token: str) -> bool:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._thread, self._claim, job, slot, run_id, token)

    def check(self, req: Any) -> None:
        from anarchon.backends.sqlite._rows import _params
        from anarchon.kit import RunStatus
        from anarchon.kit.lease import first_attempt

        now = 1_000
        row = first_attempt(
            req, now, RunStatus.RUNNING, None, slot=req.slot, token=req.token, fence=7,
            lease_expires_at=now + req.lease_ms,
        )  # fmt: skip
        ours = self.row(req.job, req.slot, req.run_id, req.token, now, 7)
        if ours != _params(row):
            raise _differs("the insert's parameters", ours, _params(row))


class RedisSameWork(SameWork):
    """``FCALL`` (or ``EVALSHA``) of the Redis backend's claim script, as the backend calls it."""

    def __init__(self, backend: Any, instance: str) -> None:
        super().__init__(backend, instance)
        from anarchon.backends.redis._keys import Namespace
        from anarchon.backends.redis._scripts import SCRIPTS, pack
        from anarchon.backends.redis._timings import RESTART_MARGIN_MS

        self.script = SCRIPTS["claim"]
        self.pack = pack
        self.url = backend.url
        self.names = Namespace(backend.prefix)
        self.pauses = self.names.control.pauses
        self.channel = self.names.claims_channel
        self.margin = RESTART_MARGIN_MS
        self._keys: dict[str, list[str]] = {}
        self._client: Any = None
        self._lane: Any = None
        self.function = False

    async def open(self) -> None:
        from redis.asyncio import Redis

        from anarchon.backends.redis._scripts import ScriptRunner

        # As the backend makes its client (redis/_connection.py): no socket timeout.
        self._client = Redis.from_url(self.url, socket_timeout=None)
        await self._client.ping()
        # As the backend loads the scripts: a function library if the server takes it.
        runner = ScriptRunner(self._client)
        await runner.load()
        self.function = runner.functions

    async def close(self) -> None:
        if self._client is not None:
            if self._lane is not None:
                await self._client.connection_pool.release(self._lane)
            await self._client.aclose()

    def keys(self, job: str) -> list[str]:
        """The script's KEYS: the job's five keys and the pauses hash."""
        found = self._keys.get(job)
        if found is None:
            found = self._keys[job] = [*self.names.job(job).all(), self.pauses]
        return found

    def args(self, job: str, slot: int, run_id: str, token: str) -> list[str]:
        """The script's three arguments for one claim of one request."""
        return [
            f'{{"job":"{job}","slot_key":"{slot}","lease_ms":{LEASE_MS},"overlap":"allow",'
            f'"restart_margin_ms":{self.margin},"slot":{slot},"pausable":true,'
            f'"claims_channel":"{self.channel}"}}',
            f'{{"job":"{job}","slot_key":"{slot}","attempt":1,"run_id":"{run_id}",'
            f'"token":"{token}","instance":"{self.instance}","trigger":"{TRIGGER}",'
            f'"slot":{slot}',
            f'["{job}","{slot}","{self.instance}",',
        ]

    async def claim(self, job: str, slot: int, run_id: str, token: str) -> bool:
        # As the backend sends one script call (_scripts.ScriptRunner._sent): packed, on the
        # connection of the client's pool kept for single calls (taken at the first), with
        # the connection's retries.
        args = self.args(job, slot, run_id, token)
        packed = self.pack(self.script, self.keys(job), args, function=self.function)
        connection = self._lane
        if connection is None:
            connection = self._lane = await self._client.connection_pool.get_connection()

        async def exchange() -> Any:
            await connection.send_packed_command(packed)
            return await connection.read_response()

        answer = await connection.retry.call_with_retry(exchange, lambda _: connection.disconnect())
        # Won: the short answer ('[[now,fence]]'); else the stored record, ours if it has our
        # token (a retry).
        return answer.startswith(b"[[") or token.encode() in answer

    def check(self, req: Any) -> None:
        from anarchon.backends.redis._rows import claim_arguments

        theirs = claim_arguments(req, None, claims_channel=self.channel)
        ours = self.args(req.job, req.slot, req.run_id, req.token)
        if ours != theirs:
            raise _differs("the claim script's arguments", ours, theirs)
        if self.keys(req.job) != [*self.names.job(req.job).all(), self.pauses]:
            raise _differs("the claim script's keys", self.keys(req.job), "")


def request_params(job: str, slot: int, run_id: str, token: str, instance: str) -> dict[str, Any]:
    """The parameters of one request's run that PostgreSQL statements name alike."""
    return {
        "job": job,
        "slot_key": str(slot),
        "slot": slot,
        "run_id": run_id,
        "token": token,
        "instance": instance,
        "trigger": TRIGGER,
    }


class PostgresClient:
    """One autocommit psycopg connection to ``dsn``, made by :meth:`open`."""

    dsn: str
    _conn: Any = None

    async def open(self) -> None:
        import psycopg

        self._conn = await psycopg.AsyncConnection.connect(self.dsn, autocommit=True)

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()


class PostgresSameWork(PostgresClient, SameWork):
    """The PostgreSQL backend's ``claim_one`` statement, and ``notify_claim`` after a win."""

    def __init__(self, backend: Any, instance: str) -> None:
        super().__init__(backend, instance)
        from anarchon.backends.postgres._queries import Names, Queries, positional

        queries = Queries(Names(backend.schema, backend.table_prefix))
        self.channel = queries.names.channel
        self.dsn = backend.dsn
        self.claim_sql, self.claim_names = positional(queries["claim_one"])
        self.notices = positional(queries["notify_claim"]) if backend.notifications else None
        self.prepare = bool(backend.prepared_statements)
        self._token_at = -1
        self._expires_at = -1

    def params(self, job: str, slot: int, run_id: str, token: str) -> dict[str, Any]:
        """The ``claim_one`` parameters of one request (``_rows.claim_one_params``)."""
        return {
            "channel": self.channel,
            # None: the claim keeps no notice, this client sends it (notify_claim).
            "later": None if self.notices is not None else False,
            **request_params(job, slot, run_id, token, self.instance),
            "lease_ms": LEASE_MS,
            "overlap_skip": False,
            "skip_reason": None,
            "skip_status": "skipped",
            "pausable": True,
            "requested_by": None,
            "skip_cause": None,
        }

    async def claim(self, job: str, slot: int, run_id: str, token: str) -> bool:
        from psycopg import AsyncRawCursor

        params = self.params(job, slot, run_id, token)
        cur = AsyncRawCursor(self._conn)
        await cur.execute(
            self.claim_sql, [params[n] for n in self.claim_names], binary=True, prepare=self.prepare
        )
        rows = await cur.fetchall()
        if self._token_at < 0:
            assert cur.description is not None
            names = [c.name for c in cur.description]
            self._token_at = names.index("token")
            self._expires_at = names.index("lease_expires_at")
        won = bool(rows) and rows[0][self._token_at] == token
        if won and self.notices is not None:
            text, _ = self.notices
            payload = self.notice(job, slot, rows[0][self._expires_at])
            await AsyncRawCursor(self._conn).execute(
                text, [self.channel, payload], binary=True, prepare=None if self.prepare else False
            )
        return won

    def notice(self, job: str, slot: int, expires: int) -> str:
        """``notify_claim``'s payload for a won claim (``_rows.claim_notice``)."""
        return json.dumps([job, str(slot), self.instance, expires], separators=(",", ":"))

    def check(self, req: Any) -> None:
        from anarchon.backends.postgres._rows import claim_notice, claim_one_params

        theirs = claim_one_params(req, self.channel, later=self.notices is not None)
        ours = self.params(req.job, req.slot, req.run_id, req.token)
        if ours != theirs:
            raise _differs("claim_one's parameters", ours, theirs)
        if self.notices is not None:
            if self.notices[1] != ("channel", "payload"):
                raise _differs("notify_claim's parameters", ("channel", "payload"), self.notices[1])
            row = {"job": req.job, "slot_key": req.slot_key, "instance": req.instance}
            theirs = claim_notice({**row, "lease_expires_at": 7}, self.channel)["payload"]
            if self.notice(req.job, req.slot, 7) != theirs:
                raise _differs("the claim notice", self.notice(req.job, req.slot, 7), theirs)


class NatsSameWork(SameWork):
    """The NATS backend's claim publish, sent as the backend sends it: the ``HPUB`` command
    written straight into nats-py's buffer and sent at the end of the event-loop turn
    (``Writer`` in ``nats/_wire.py``), its ack heard on one subscription of the
    connection, handed over raw as nats-py's parser reads it (``subscribe_raw``), on a
    connection that reads 64 KiB at a time (``set_read_size``), as the backend's own
    connections do. Without the backend's time limit per publish (one timer per connection
    there)."""

    def __init__(self, backend: Any, instance: str, url: str) -> None:
        super().__init__(backend, instance)
        from anarchon.backends.nats._subjects import CLAIM_ID, CLAIMS

        parts = urlsplit(url)
        self.servers = f"{parts.scheme}://{parts.netloc}"
        self.prefix = backend.prefix
        self.subject, self.msg_id = CLAIMS, CLAIM_ID
        self._nc: Any = None
        self._writer: Any = None
        self._inbox = ""
        self._skip = 0
        self._count = 0
        self._waiting: dict[int, asyncio.Future[bytes]] = {}

    async def open(self) -> None:
        import nats

        from anarchon.backends.nats._client import set_read_size
        from anarchon.backends.nats._wire import OPENED, Writer, subscribe_raw

        self._nc = await nats.connect(servers=[self.servers], connect_timeout=5)
        # The raw paths serve only the clients the backend opened itself (OPENED; see
        # raw_ready): this one stands for the backend's own, so it takes them as they do.
        # Without it the floor went through nats-py's publish and parsed messages.
        OPENED.add(self._nc)
        set_read_size(self._nc)
        self._writer = Writer(self._nc, asyncio.get_running_loop())
        self._inbox = self._nc.new_inbox() + "."
        self._skip = len(self._inbox)
        await subscribe_raw(self._nc, self._inbox + "*", self._heard)

    def _heard(self, subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        future = self._waiting.pop(int(subject[self._skip :]), None)
        if future is not None and not future.done():
            future.set_result(data)

    async def close(self) -> None:
        if self._nc is not None:
            await self._nc.close()

    def payload(self, job: str, slot: int, run_id: str, token: str) -> bytes:
        """The claim message's payload (``_records.encode_claim``)."""
        return (
            f'{{"v":1,"job":"{job}","slot":{slot},"slot_key":"{slot}","run_id":"{run_id}",'
            f'"token":"{token}","instance":"{self.instance}","trigger":"{TRIGGER}"}}'
        ).encode()

    async def claim(self, job: str, slot: int, run_id: str, token: str) -> bool:
        self._count += 1
        n = self._count
        future = self._waiting[n] = asyncio.get_running_loop().create_future()
        subject = self.subject.format(prefix=self.prefix, job=job)
        reply = f"{self._inbox}{n}"
        payload = self.payload(job, slot, run_id, token)
        msg_id = self.msg_id.format(job=job, slot_key=slot)
        if not self._writer.write(subject, reply, payload, msg_id):  # as Acks.publish
            await self._writer.through_client(subject, reply, payload, msg_id)
        ack = json.loads((await future).decode())
        if "error" in ack:
            raise RuntimeError(f"NATS refused the claim's publish: {ack['error']}")
        return not ack.get("duplicate", False)

    def check(self, req: Any) -> None:
        from anarchon.backends.nats._records import encode_claim

        ours, theirs = self.payload(req.job, req.slot, req.run_id, req.token), encode_claim(req)
        if ours != theirs:
            raise _differs("the claim's payload", ours, theirs)


def make_same_work(name: str, backend: Any, instance: str, url: str) -> SameWork:
    """The same-work floor of the started ``backend`` (``name``: "sqlite", "redis",
    "postgres", "nats"; ``url``: the backend's URL) for claims by ``instance``."""
    if name == "sqlite":
        return SQLiteSameWork(backend, instance)
    if name == "redis":
        return RedisSameWork(backend, instance)
    if name == "postgres":
        return PostgresSameWork(backend, instance)
    if name == "nats":
        return NatsSameWork(backend, instance, url)
    raise ValueError(f"no same-work floor for backend {name!r}")
