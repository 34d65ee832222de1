"""The PostgreSQL lease backend: the contract's methods, in the order of :mod:`anarchon.backend`.

Each method names its statements (``queries.sql``, composed by ``_queries.py``), runs them
through ``_connection.py`` (the pool and the bounded call), ``_statements.py`` and
``_transactions.py``, and turns their rows into answers with ``_rows.py``. The claim path:
:meth:`PostgresBackend.claim` calls the server-side function ``claim_function`` (which locks,
then decides by ``claim_alone``, ``claim_plain`` or ``claim_decide``) in one statement, and
``_rows.claim_outcome`` reads each request's answer from its row.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Final, TypeAlias

from anarchon import backend as contract
from anarchon.errors import BackendError, BackendUnavailable
from anarchon.kit import Run, Trigger, backoff
from anarchon.kit.feed import ChangeFeed
from anarchon.kit.lease import check_ticket, refused_outcome, unstorable

from . import _rows as rows
from ._connection import describe_server
from ._control import PostgresControl
from ._errors import NOT_READ_COMMITTED
from ._listener import Listener
from ._migrations import check_readable, migrate
from ._options import DEFAULT_DSN, DEFAULT_PREFIX, DEFAULT_SCHEMA, check_options, split_url
from ._queries import Names, Queries
from ._registry import PostgresRegistry
from ._statements import Rows, Statement
from ._transactions import Group, Transactions, Work

if TYPE_CHECKING:
    from psycopg import AsyncConnection
    from psycopg_pool import AsyncConnectionPool

    PoolOrConnection: TypeAlias = AsyncConnectionPool[Any] | AsyncConnection[Any]
else:
    # psycopg is imported when a backend is built, not before: at run time (for
    # typing.get_type_hints of the constructor) what pool= takes is Any.
    PoolOrConnection = Any

__all__ = ["PostgresBackend"]

# Without notifications (PgBouncer in transaction mode), backups re-check a watched run this
# often, so a hand-over is noticed within about this long instead of at lease expiry.
POLL_MS: Final = 500
# Results recorded in one transaction, and in one call (one round trip, well inside timeout_ms).
FINISH_GROUP: Final = 50
FINISH_CALL: Final = 250
# How long the first subscribe() waits for the first LISTEN before going on without it.
LISTEN_WAIT_S: Final = 2.0
# Jobs whose last slots one statement looks up (a start with 100 000 jobs: ten statements).
LAST_SLOTS_BATCH: Final = 10_000
# The longest a new connection's warm-up (PostgresBackend._warm) may wait, at most half of
# timeout_ms: the pool hands the connection out unwarmed after that.
WARM_UP_LIMIT_MS: Final = 1_000
# The waits between attempts to LISTEN again.
_listen_backoff = functools.partial(backoff, first=0.2, cap=5.0)


class PostgresBackend(contract.LeaseBackend):
    """Claims, leases and history in PostgreSQL tables, for any number of hosts.

    :param dsn: a libpq connection string or URL; the backend opens (and closes) its own pool
        on it. Ignored when ``pool`` is given.
    :param pool: a :class:`psycopg_pool.AsyncConnectionPool` or a single
        :class:`psycopg.AsyncConnection` to use instead; it stays the caller's (never closed).
        A single connection serialises every call and cannot be replaced if it breaks.
    :param schema: the schema of the tables; created if missing.
    :param table_prefix: prefix of the table and index names.
    :param history_size: at most about this many runs are kept per job.
    :param notifications: LISTEN for releases and results so backups act at once. Turn it off
        behind PgBouncer in transaction mode (LISTEN needs a session): backups then poll.
    :param timeout_ms: the longest one call may take, waiting for a connection included, before
        it fails with :class:`~anarchon.errors.BackendUnavailable`.
    :param max_connections: size of the pool the backend opens on ``dsn``.
    :param prepared_statements: prepare statements on the server (faster). Turn it
        off behind PgBouncer in transaction mode before 1.21, which cannot route them.
    """

    name = "postgres"

    def __init__(
        self,
        dsn: str = DEFAULT_DSN,
        pool: PoolOrConnection | None = None,
        schema: str = DEFAULT_SCHEMA,
        table_prefix: str = DEFAULT_PREFIX,
        *,
        history_size: int = 1000,
        notifications: bool = True,
        timeout_ms: int = 5_000,
        max_connections: int = 10,
        prepared_statements: bool = True,
    ) -> None:
        options = check_options(
            dsn,
            pool,
            schema,
            table_prefix,
            history_size=history_size,
            notifications=notifications,
            timeout_ms=timeout_ms,
            max_connections=max_connections,
            prepared_statements=prepared_statements,
        )
        self._options = options
        self.dsn = options.dsn
        self.schema, self.table_prefix = options.schema, options.table_prefix
        self.history_size, self.timeout_ms = options.history_size, options.timeout_ms
        self.max_connections = options.max_connections
        self.notifications = options.notifications
        self.prepared_statements = options.prepared_statements
        if not options.notifications:
            self.release_poll_ms = POLL_MS
        self._queries = Queries(Names(options.schema, options.table_prefix))
        self._where = describe_server(options)
        self._db = Transactions(options, self._queries, self._where, repr(self))
        self._feed = ChangeFeed(self.name)
        q = self._queries
        self._notices: Statement | None = (
            (q["send_notices"], {"channel": q.names.channel}) if options.notifications else None
        )
        self._listener: Listener | None = None
        # One request is claimed by one statement until the server's isolation level refuses it.
        self._one_statement = True
        # Whether this backend claims (its pool's connections are warmed for it, see _warm): a
        # clone keeps leases only.
        self._claims = True

    @classmethod
    def from_url(cls, url: str) -> PostgresBackend:
        """Build from ``postgresql://user@host:5432/db?schema=s&table_prefix=p``.

        The backend's own options (``schema``, ``table_prefix``, ``notifications``,
        ``prepared_statements``, ``history_size``, ``timeout_ms``, ``max_connections``) are
        taken out of the query string; everything else (``sslmode``, ``application_name``,
        ``host=/run/postgresql`` ...) stays in the DSN as written.
        """
        dsn, options = split_url(url)
        return cls(dsn, **options)

    def __repr__(self) -> str:
        return (
            f"PostgresBackend({self._where!r}, schema={self.schema!r}, "
            f"table_prefix={self.table_prefix!r})"
        )

    @property
    def _test_clock_offset_ms(self) -> int:
        """Test-only: milliseconds added to the database clock on this backend's connections
        (0 in production; see tests/conformance/test_differential.py)."""
        return self._db.test_clock_offset_ms

    @_test_clock_offset_ms.setter
    def _test_clock_offset_ms(self, offset: int) -> None:
        self._db.test_clock_offset_ms = offset

    async def start(self) -> None:
        """Open the pool (if the backend owns it) and migrate the tables. Idempotent."""
        warm = self._warm if self._claims else None
        await self._db.open(lambda conn: migrate(conn, self._queries, self._where), warm)

    async def start_reader(self) -> None:
        """Open the pool and check that the tables are there; create or change nothing."""
        await self._db.open(lambda conn: check_readable(conn, self._queries, self._where))

    async def stop(self) -> None:
        """Stop listening and close the pool the backend opened (never the caller's)."""
        await self._feed.stop()
        self._listener = None
        await self._db.close()

    async def claim(self, requests: Sequence[contract.ClaimRequest]) -> list[contract.ClaimOutcome]:
        """See :meth:`anarchon.backend.Backend.claim`.

        A batch is one call of the server-side function ``claim_function``, sent as one
        statement (a transaction of its own) in one round trip: it answers a batch whose slots
        are all recorded without locking a row (so an instance that lost the race commits
        without a log flush), else locks the rows of its jobs and decides every request in one
        statement. A winner's claim notices are sent after the answer. A batch naming
        one slot twice is split so that the second request sees the first. A request the
        database cannot store is answered on its own (LOST with ``error``); if the server
        refuses a batch for a value of one request, each request of it is decided alone.
        """
        if len(requests) == 1 and unstorable(requests[0]) is None:
            # One request (a slot due alone): nothing to split or to decide apart.
            return await self._db.call(functools.partial(self._claim, [requests[0]]))
        reqs = list(requests)
        outcomes: list[contract.ClaimOutcome | None] = [None] * len(reqs)
        good: list[int] = []
        for n, req in enumerate(reqs):
            error = unstorable(req)
            if error is None:
                good.append(n)
            else:
                outcomes[n] = refused_outcome(req, 0, error)
        for chunk in rows.without_repeats([(n, reqs[n]) for n in good]):
            try:
                decided = await self._db.call(functools.partial(self._claim, [r for _, r in chunk]))
            except BackendUnavailable:
                raise
            except BackendError:
                if len(chunk) == 1:
                    raise
                decided = [await self._claim_alone(req) for _, req in chunk]
                failed = [o.error for o in decided if o.error is not None]
                if len(failed) == len(decided):
                    raise failed[0] from None  # not one request's values: the whole call
            for (n, _), outcome in zip(chunk, decided, strict=True):
                outcomes[n] = outcome
        return [o for o in outcomes if o is not None]

    async def _claim_alone(self, req: contract.ClaimRequest) -> contract.ClaimOutcome:
        try:
            [outcome] = await self._db.call(functools.partial(self._claim, [req]))
        except BackendUnavailable:
            raise
        except BackendError as exc:
            return refused_outcome(req, 0, exc)
        return outcome

    async def _claim(
        self, reqs: list[contract.ClaimRequest], conn: AsyncConnection[Any]
    ) -> list[contract.ClaimOutcome]:
        q = self._queries
        later = self._send_notices()
        found = None
        if self._one_statement and conn.autocommit:
            found = await self._claim_statement(reqs, conn, later)
        if found is None:
            found = await self._db.transaction(
                conn,
                [],
                q["claim"],
                rows.claim_batch_params(reqs, q.names.channel, later=later is not None),
                later,
            )
        if len(found) != len(reqs):
            raise BackendError(f"claim answered {len(found)} rows for {len(reqs)} requests")
        return [rows.claim_outcome(req, row) for req, row in zip(reqs, found, strict=True)]

    async def _claim_statement(
        self, reqs: list[contract.ClaimRequest], conn: AsyncConnection[Any], later: Statement | None
    ) -> Rows | None:
        """The batch as one statement, a transaction of its own on an autocommit connection:
        one message and one round trip, without pipeline mode (whose BEGIN, COMMIT and
        synchronisation cost the client more than the claim itself, and whose messages, sent
        one by one, wake the server once each). A winner's ``send_notices`` (for one request,
        its notice sent by ``notify_claim``) runs after the answer is handed over
        (:meth:`Connections.defer`). None when the connection's default
        isolation level is not READ COMMITTED, which the claim function refuses: from then on
        this backend sends its claims inside BEGIN."""
        q = self._queries
        channel, kept = q.names.channel, later is not None
        if len(reqs) == 1:
            query, params = q["claim_one"], rows.claim_one_params(reqs[0], channel, later=kept)
        else:
            query, params = q["claim"], rows.claim_batch_params(reqs, channel, later=kept)
        try:
            found = await self._db.statement(conn, query, params)
        except Exception as exc:
            if getattr(exc, "sqlstate", None) != NOT_READ_COMMITTED:
                raise
            self._one_statement = False
            return None
        if later is not None and rows.won_any(found):
            if len(reqs) == 1:
                self._db.defer(conn, (q["notify_claim"], rows.claim_notice(found[0], channel)))
            else:
                self._db.defer(conn, later)
        return found

    async def _warm(self, conn: AsyncConnection[Any]) -> None:
        """Plan the claim on a new connection of the backend's pool before a claim uses it.

        A session compiles the claim function and plans each of its statements the first time
        it runs them, and psycopg prepares the claim's statement once per connection: the first
        claim a connection wins took 8.3 ms for 17 requests where the next took 1.7 ms (one
        client, fresh slots, 12 new connections, medians). The pool hands its connections out
        in turn, so at one instant the winner was often on a connection that had never won a
        claim. Here every path of the function runs once, on made-up jobs, in a transaction
        rolled back: one request won (a new job), a batch won, a batch that claim_decide
        decides (a request with a skip reason). Nothing is committed, no log is flushed, and the
        plans and prepared statements stay with the session."""
        q = self._queries
        channel, later = q.names.channel, self._notices is not None
        name = f"anarchon-warm-up-{uuid.uuid4().hex}"

        def req(job: int, slot: int, skip: str | None = None) -> contract.ClaimRequest:
            return contract.ClaimRequest(
                job=f"{name}-{job}",
                slot=slot,
                run_id=f"{name}-{job}-{slot}",
                token=name,
                instance=name,
                trigger=Trigger.SCHEDULE,
                lease_ms=1,
                skip_reason=skip,
            )

        one = rows.claim_one_params(req(1, 0), channel, later=later)
        won = rows.claim_batch_params([req(2, 0), req(3, 0)], channel, later=later)
        decided = rows.claim_batch_params([req(2, 1), req(3, 1, "warm-up")], channel, later=later)
        async with conn.transaction(force_rollback=True):
            await conn.execute(q["read_committed"], prepare=False)
            limit = min(WARM_UP_LIMIT_MS, self.timeout_ms // 2)
            await conn.execute(q["warm_up_limit"], {"ms": str(limit)}, prepare=False)
            for query, params in ((q["claim_one"], one), (q["claim"], won), (q["claim"], decided)):
                await self._db.statement(conn, query, params)
        # psycopg forgets what it prepared once a transaction is rolled back (a rollback may undo
        # what a statement refers to): the batch's statement is prepared again by a claim of no
        # request, which runs the function's statements on no rows and writes nothing.
        await self._db.statement(
            conn, q["claim"], rows.claim_batch_params([], channel, later=later)
        )

    async def finish_many(
        self, items: Sequence[contract.FinishRequest]
    ) -> list[Run | BackendError]:
        """See :meth:`anarchon.backend.Backend.finish_many`: results are grouped by job,
        :data:`FINISH_GROUP` to a transaction (their jobs' rows locked, in the claims' order,
        then one statement per result records, prunes and notifies), the transactions of up to
        :data:`FINISH_CALL` results sent in one round trip (pipeline mode). A group that fails
        is sent again one result per transaction: one failing item fails alone.

        A burst of ten thousand results so costs a few hundred commits, in calls that each
        stay well inside ``timeout_ms``, rather than ten thousand commits in one call that
        does not.
        """
        batch = list(items)
        q = self._queries
        later = self._send_notices() is not None
        order = sorted(range(len(batch)), key=lambda n: batch[n][0].job)
        answers: dict[int, Rows | BackendError] = {}
        for start in range(0, len(order), FINISH_CALL):
            call = order[start : start + FINISH_CALL]
            groups: list[Group] = []
            for first in range(0, len(call), FINISH_GROUP):
                members = [batch[n] for n in call[first : first + FINISH_GROUP]]
                jobs = sorted({item.ticket.job for item in members})
                params = [
                    rows.finish_params(item, self.history_size, q.names.channel, later=later)
                    for item in members
                ]
                groups.append(([(q["lock_jobs"], {"jobs": jobs})], q["finish"], params))
            answered = await self._db.groups(groups, self._send_notices())
            for n, answer in zip(call, answered, strict=True):
                answers[n] = answer
        return [
            answer
            if isinstance(answer, BackendError)
            else rows.finished(item.ticket, item.status, item.error, answer)
            for item, answer in ((item, answers[n]) for n, item in enumerate(batch))
        ]

    def _send_notices(self) -> Statement | None:
        """The statement that sends, right after COMMIT, the notifications a claim or a result
        kept (``send_notices`` in queries.sql: a transaction that notifies holds a cluster-wide
        lock through its commit). None with notifications off: behind PgBouncer in transaction
        mode the next statement may run in another session, so they are sent at commit."""
        return self._notices

    async def history(self, job: str, limit: int = 100) -> list[Run]:
        """See :meth:`anarchon.backend.Backend.history`; an index scan of ``limit`` rows."""
        found = await self._db.read(self._queries["history"], {"job": job, "limit": limit})
        return rows.runs(found)

    async def slot_records(self, job: str, slot: int) -> contract.SlotRecords:
        """See :meth:`anarchon.backend.Backend.slot_records`: one statement of index lookups,
        whatever the size of the job's history."""
        found = await self._db.read(self._queries["slot_records"], {"job": job, "slot": slot})
        return rows.slot_records(found)

    async def histories(self, jobs: Sequence[str], limit: int = 100) -> dict[str, list[Run]]:
        """See :meth:`anarchon.backend.Backend.histories`: one statement (the ``history`` index
        range of each job, in a ``LATERAL`` subquery), one round trip."""
        names = list(dict.fromkeys(jobs))
        found: dict[str, list[Run]] = {job: [] for job in names}
        if limit <= 0 or not names:
            return found
        params = {"jobs": names, "limit": limit}
        for run in rows.runs(await self._db.read(self._queries["histories"], params)):
            found[run.job].append(run)
        return found

    async def server_time_ms(self) -> int | None:
        """The database clock, ``clock_timestamp()``, in epoch ms."""
        [row] = await self._db.read(self._queries["now"])
        return int(row["now"])

    async def subscribe_claims(self, on_claims: contract.ClaimListener) -> bool:
        """Hear the claim notices the claim statement sends (``pg_notify``, at commit) on the
        LISTEN connection that wakes backups; False when notifications are off."""
        if not self.notifications:
            return False
        self._feed.add_claims(on_claims)
        await self._listen()
        return True

    async def _listen(self) -> None:
        """Start the LISTEN connection once; the first subscriber waits for it (bounded)."""
        if self._listener is None:
            self._listener = Listener(
                self._db.connect_listener, self._queries.names.channel, self._where
            )
            self._feed.start(
                self._listener.next_changes, delays=_listen_backoff, errors=(BackendError,)
            )
            await self._feed.wait_live(LISTEN_WAIT_S)

    def registry(self) -> PostgresRegistry:
        """The registry, in a table of its own beside the backend's (see ``_registry``)."""
        return PostgresRegistry(self)

    def control(self) -> PostgresControl:
        """Pauses and run requests, in tables beside the runs (see ``_control``); the claim
        reads the pauses in its own statement."""
        return PostgresControl(self)

    async def renew_many(
        self, tickets: Sequence[contract.Ticket]
    ) -> list[contract.Ticket | BackendError]:
        """See :meth:`anarchon.backend.LeaseBackend.renew_many`: one statement per ticket, each
        its own transaction, all sent in one round trip (pipeline mode)."""
        batch = list(tickets)
        out: list[contract.Ticket | BackendError | None] = [check_ticket(t) for t in batch]
        todo = [n for n, found in enumerate(out) if found is None]
        if todo:
            renew = self._queries["renew"]
            work: list[Work] = [
                ([], renew, {**rows.ticket_params(batch[n]), "lease_ms": batch[n].lease_ms})
                for n in todo
            ]
            answers = await self._db.each(work)
            for n, answer in zip(todo, answers, strict=True):
                if isinstance(answer, BackendError):
                    out[n] = answer
                else:
                    out[n] = rows.renewed(batch[n], answer[0])
        return [o for o in out if o is not None]

    async def take_over(self, request: contract.TakeoverRequest) -> contract.TakeoverOutcome:
        """See :meth:`anarchon.backend.LeaseBackend.take_over`.

        A read answers the common cases (ENDED, HELD, a retried TAKEN) without a lock. An
        expired or released lease is taken over in a transaction that first locks the job's
        row, so a backup that lost the race to another one sees the new attempt: HELD.
        """
        error = unstorable(request)
        if error is not None:
            raise error
        q = self._queries
        params = rows.takeover_params(request, q.names.channel)

        async def work(conn: AsyncConnection[Any]) -> contract.TakeoverOutcome:
            [peeked] = await self._db.select(conn, q["peek_takeover"], params)
            answer = rows.peeked_takeover(request, peeked)
            if answer is not None:
                return answer
            lock: list[Statement] = [(q["lock_job"], {"job": request.job})]
            [row] = await self._db.transaction(conn, lock, q["take_over"], params)
            return rows.takeover_outcome(request, row)

        return await self._db.call(work)

    async def release(self, ticket: contract.Ticket, reason: str) -> None:
        """See :meth:`anarchon.backend.LeaseBackend.release`; backups hear it by NOTIFY."""
        q = self._queries
        params = {**rows.ticket_params(ticket), "channel": q.names.channel}

        async def work(conn: AsyncConnection[Any]) -> None:
            [row] = await self._db.transaction(conn, [], q["release"], params)
            lost = rows.released_or_lost(ticket, row)
            if lost is not None:
                raise lost

        await self._db.call(work)

    async def last_slot(self, job: str) -> int | None:
        """See :meth:`anarchon.backend.LeaseBackend.last_slot`; two index-only lookups."""
        [row] = await self._db.read(self._queries["last_slot"], {"job": job})
        return None if row["slot"] is None else int(row["slot"])

    async def last_slots(self, jobs: Sequence[str]) -> dict[str, int | None]:
        """See :meth:`anarchon.backend.LeaseBackend.last_slots`: one statement per
        :data:`LAST_SLOTS_BATCH` jobs (the same index-only lookups as :meth:`last_slot`)."""
        found: dict[str, int | None] = {}
        names = list(jobs)
        for at in range(0, len(names), LAST_SLOTS_BATCH):
            batch = names[at : at + LAST_SLOTS_BATCH]
            rows = await self._db.read(self._queries["last_slots"], {"jobs": batch})
            for row in rows:
                found[row["job"]] = None if row["slot"] is None else int(row["slot"])
        return found

    async def open_runs(self, jobs: Sequence[str], since_ms: int) -> list[Run]:
        """See :meth:`anarchon.backend.LeaseBackend.open_runs`: one statement per
        :data:`LAST_SLOTS_BATCH` jobs, through the index of running attempts."""
        names = list(dict.fromkeys(jobs))
        found: list[Run] = []
        for at in range(0, len(names), LAST_SLOTS_BATCH):
            batch = names[at : at + LAST_SLOTS_BATCH]
            params = {"jobs": batch, "since": since_ms}
            found += rows.runs(await self._db.read(self._queries["open_runs"], params))
        return found

    async def subscribe(self, on_change: Callable[[str, str, bool], None]) -> None:
        """LISTEN for releases and results on a dedicated connection (unless notifications are
        off); reconnects with backoff. Missed notifications only delay a backup until the
        lease expires. The first subscriber waits up to two seconds for the first LISTEN. A
        listener that raises is logged and the others still hear of it."""
        if not self.notifications:
            return
        self._feed.add(on_change)
        await self._listen()

    def clone(self) -> PostgresBackend | None:
        """A new, unstarted backend on the same database, schema and prefix with a small pool
        of its own (two connections), for the scheduler's lease keeper thread (its connections
        are not warmed for claims: it renews leases). From a pool or
        connection you passed in, the copy connects with its connection string; None when
        that cannot be read (a conninfo function, connection keyword arguments)."""
        dsn = self._db.copyable_dsn()
        if dsn is None:
            return None
        own = replace(self._options, dsn=dsn, pool=None, max_connections=2)
        copy = PostgresBackend(**own.arguments())
        copy._claims = False
        return copy
