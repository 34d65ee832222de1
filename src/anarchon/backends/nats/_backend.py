"""NatsBackend: the contract methods, in the order of :mod:`anarchon.backend`.

Each method is a thin call into the package: :mod:`._claims` (the claim path),
:mod:`._results` (results), :mod:`._settle` (settling claims nobody runs, and the upkeep),
:mod:`._window` (the duplicate window jobs are checked against), :mod:`._connection`
(every NATS call, bounded and translated; the client opened by :mod:`._client`),
:mod:`._buckets` (the key-value buckets), :mod:`._wire` (publishes and subscriptions on
nats-py's internals, for speed), :mod:`._stream` (creating or evolving the stream),
:mod:`._records` (payloads and runs), :mod:`._subjects` (what is stored where),
:mod:`._context` (the connection, window and prefix the parts share) and :mod:`._options`
(option checks and the URL form).

This is a broker: no leases, so no backup runners, overlap protection, catch-up or hand-over
(``capabilities`` is empty and the core rejects those options when a job is added).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final, Unpack

from ...backend import (
    Backend,
    ClaimListener,
    ClaimNotice,
    ClaimOutcome,
    ClaimRequest,
    FinishRequest,
    JobPolicy,
    Ticket,
)
from ...control import RunRequest
from ...errors import BackendError
from ...kit import Run, RunStatus, check_keywords, check_name, redact_url
from ...kit.feed import ChangeFeed, decode_notices, encode_notice
from ...kit.lease import retries_first
from . import _records as records
from . import _stream as stream_setup
from . import _subjects as subjects
from . import _timings as timings
from ._buckets import Buckets
from ._claims import ClaimPath
from ._client import import_nats
from ._connection import Connection, cancel_unfinished, within
from ._context import Context
from ._control import NatsControl
from ._guard import Guard
from ._histories import read_histories
from ._options import (
    DEFAULT_SERVERS,
    Access,
    AccessKwargs,
    check_access,
    check_connection,
    check_history_size,
    check_replicas,
    check_servers,
    check_shrink_window,
    check_window,
    merge_credentials,
    parse_url,
    split_credentials,
    url_secrets,
)
from ._records import NOTICES_PER_MESSAGE, notices_message
from ._registry import NatsRegistry, bucket_streams
from ._subjects import check_prefix, check_stream
from ._window import Window
from ._wire import subscribe_raw

if TYPE_CHECKING:
    from nats.aio.client import Client as NATS
else:
    # nats-py is imported when a backend is built, not before: at run time (for
    # typing.get_type_hints of the constructor) the connection's type is Any.
    NATS = Any

__all__ = ["NatsBackend"]

# last_run() looks at most this many results after the newest claim before reading the job.
LAST_RUN_SCAN: Final = 32
# last_slots() reads at most this many jobs' newest claims at once.
LAST_SLOTS_AT_ONCE: Final = 32


class NatsBackend(Backend):
    """Claims and history in a NATS JetStream stream; one winner per slot by de-duplication.

    :param servers: one URL or a list (``nats://host:4222``, ``tls://...``, credentials as
        ``nats://user:password@host`` or ``nats://token@host``, percent-decoded: ``p%40ss``
        is ``p@ss``); ignored when ``connection`` is given. A ``tls://`` URL requires TLS.
    :param connection: your own connected nats-py client; you keep ownership (``stop()`` never
        closes it).
    :param stream: the JetStream stream name.
    :param prefix: the subject prefix; a job's subjects are ``<prefix><job>.claims`` and
        ``<prefix><job>.results``.
    :param duplicate_window_ms: the least duplicate window this instance keeps on the stream:
        a new stream gets it, a smaller window is grown to it, a larger one is kept. Every
        job's ``jitter_ms + max_late_ms`` plus the claim retry margin (10 s) must be less than
        the window; 100 ms to 10 years.
    :param history_size: roughly how many runs are kept per job, at least (the stream's
        per-subject limit); 1 to 1 000 000.
    :param replicas: replicas of the stream in a NATS cluster; 1 for a new stream when not
        given, and an existing stream keeps its own unless given.
    :param shrink_window: set the stream's window to ``duplicate_window_ms`` even when it is
        larger (windows otherwise only grow). Other running instances whose jobs need more raise
        it again within a minute.
    :param access_options: how to authenticate and encrypt, as keyword arguments
        (``AccessKwargs``): ``user`` (user name, with ``password``), ``password`` (never
        printed), ``token`` (an authentication token; never printed), ``creds`` (path of a
        ``.creds`` file: user JWT and nkey seed; needs ``nats-py[nkeys]``), ``ca_file`` (PEM file
        of the certificate authorities that signed the server's certificate), ``cert_file`` (PEM
        file of a client certificate, and its key unless ``key_file``), ``key_file`` (PEM file of
        the client certificate's key).
    """

    name = "nats"

    def __init__(
        self,
        servers: str | Sequence[str] = DEFAULT_SERVERS,
        *,
        connection: NATS | None = None,
        stream: str = "CRON",
        prefix: str = "cron.",
        duplicate_window_ms: int = 300_000,
        history_size: int = 1000,
        replicas: int | None = None,
        shrink_window: bool = False,
        **access_options: Unpack[AccessKwargs],
    ) -> None:
        check_keywords("NatsBackend.__init__", access_options, AccessKwargs.__optional_keys__)
        import_nats()
        self.servers: list[str] = check_servers(servers)
        check_connection(connection)
        self.shrink_window = check_shrink_window(shrink_window)
        # Credentials in the URLs become options (percent-decoded; nats-py takes a URL's user
        # part as it is written); a caller's connection ignores the URLs.
        bare, from_url = (
            (self.servers, {}) if connection is not None else (split_credentials(self.servers))
        )
        access = Access(**merge_credentials(access_options, from_url))
        check_access(access, connection)
        connect_options = access.connect_options()
        self.stream = check_stream(stream)
        self.prefix = check_prefix(prefix)
        self.duplicate_window_ms = check_window(duplicate_window_ms)
        self.history_size = check_history_size(history_size)
        self.replicas = check_replicas(replicas)
        self._yours = connection is not None
        self._conn = Connection(
            servers=bare,
            shown=self.servers,
            connect_options=connect_options,
            secrets=[*access.secrets, *(x for s in self.servers for x in url_secrets(s))],
            given=connection,
            stream=self.stream,
            owner=repr(self),
        )
        self._buckets = Buckets(self._conn)
        self._window = Window(
            self._conn, stream=self.stream, duplicate_window_ms=self.duplicate_window_ms
        )
        self._wanted = stream_setup.Wanted(
            stream=self.stream,
            prefix=self.prefix,
            duplicate_window_ms=self.duplicate_window_ms,
            history_size=self.history_size,
            replicas=self.replicas,
            shrink_window=self.shrink_window,
        )
        self._context = Context(self._conn, self._window, self.prefix)
        self._guard = Guard(self._context, self._buckets, self._wanted)
        self._guarding: asyncio.Future[None] | None = None
        self._control = NatsControl(self)
        self._claims = ClaimPath(
            self._context, history_size=self.history_size, control=self._control
        )
        self._claims.announce = self._announce
        self._upkeep: asyncio.Future[None] | None = None
        self._feed = ChangeFeed(self.name)
        self._claimed: Any = None  # the subscription to claim notices, once subscribed
        # The default prefix keeps the subject older versions use; another prefix has its own,
        # so that a prefix sharing the stream never hears another's wins (see _subjects).
        self._claimed_subject = (
            subjects.CLAIMED.format(stream=self.stream)
            if self.prefix == "cron."
            else subjects.PREFIX_CLAIMED.format(stream=self.stream, prefix=self.prefix)
        )

    def __repr__(self) -> str:
        where = "connection=<yours>" if self._yours else repr([redact_url(s) for s in self.servers])
        return f"NatsBackend({where}, stream={self.stream!r}, prefix={self.prefix!r})"

    @classmethod
    def from_url(cls, url: str) -> NatsBackend:
        """Build from ``nats://host:4222?stream=CRON&prefix=cron.&duplicate_window_ms=300000``.

        Several servers: ``nats://n1:4222,n2:4222,n3:4222?...`` or repeated ``server=`` query
        parameters (full URLs). Also ``history_size``, ``replicas``, ``shrink_window``, and the
        files ``ca_file``, ``cert_file``, ``key_file`` and ``creds``; ``tls://`` works too.
        Credentials: ``nats://user:password@host`` or ``nats://token@host``.
        """
        parsed = parse_url(url)
        return cls(parsed.servers, **parsed.options)

    # -- the contract, in backend.py's order ------------------------------------------------

    async def start(self) -> None:
        """Connect (unless given a connection) and create or update the stream. Idempotent.

        While started, a stream or key-value bucket lost under this instance (deleted, or its
        server restarted without its store) is created again: a bucket at once, the stream
        once it has been missing for one duplicate window, so that no slot it recorded can be
        claimed again (see :mod:`._guard`).

        Raises :class:`~anarchon.errors.BackendError` within seconds, saying what is wrong and
        how to fix it: server unreachable, credentials or TLS refused, JetStream not enabled
        (``nats-server -js``), a stream or prefix the server refuses. Raises
        :class:`~anarchon.errors.InvalidOption` if a job added before start needs a longer
        duplicate window than the stream has.
        """
        await self._open(read_only=False)

    async def start_reader(self) -> None:
        """Connect to read history only: the stream must exist and is left exactly as it is."""
        await self._open(read_only=True)

    async def _open(self, *, read_only: bool) -> None:
        if self._conn.started:
            return
        await self._conn.open()
        self._claims.open()
        try:
            info = await self._conn.prepare_stream(self._wanted, read_only=read_only)
            if read_only:
                stream_setup.require_prefix(info, self._wanted)
            self._window.learn(info)
            if not read_only:
                await stream_setup.align_buckets(
                    self._conn.api, self.stream, bucket_streams(self.stream), self._conn.replicas
                )
                self._upkeep = asyncio.ensure_future(self._claims.settler.upkeep())
                # A stream or bucket lost from now on is made again (a reader makes nothing).
                self._guarding = asyncio.ensure_future(self._guard.run())
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        """Close the connection this backend opened; never one you passed in.

        Bounded, whatever the server does (it may have stopped answering, or reading): the
        background work is cancelled, the claims' and pauses' subscriptions are ended within
        :data:`._timings.LET_GO_S` and the connection is closed within seconds (its socket
        dropped if the server reads nothing more); a step past its bound is logged and left."""
        upkeep, self._upkeep = self._upkeep, None
        await cancel_unfinished(upkeep)
        guarding, self._guarding = self._guarding, None
        await cancel_unfinished(guarding)
        try:
            await within(
                self._let_go(), timings.LET_GO_S, f"{self!r}: ending its claims and pauses"
            )
        finally:
            await self._feed.stop()
            await self._conn.close()

    async def _let_go(self) -> None:
        """The part of :meth:`stop` that still talks to the server: the claims (the claims
        nobody runs settled, the claims feed ended), the pause watch, the claim notices'
        subscription."""
        await self._claims.close()
        await self._control.close()
        claimed, self._claimed = self._claimed, None
        if claimed is not None:  # on a connection you passed in, it outlives this backend
            with contextlib.suppress(Exception):
                await claimed.unsubscribe()

    def check_job(self, policy: JobPolicy) -> None:
        """Require ``jitter_ms + max_late_ms + CLAIM_MARGIN_MS < `` the duplicate window.

        Before start() the window is this instance's ``duplicate_window_ms``; once started it is
        the stream's real window, which other instances may have grown past it.
        """
        self._window.check_job(policy)

    def skew_budget_ms(self, policy: JobPolicy) -> int | None:
        """The duplicate window less ``jitter_ms + max_late_ms + CLAIM_MARGIN_MS``."""
        return self._window.skew_budget_ms(policy)

    async def claim(self, requests: Sequence[ClaimRequest]) -> list[ClaimOutcome]:
        """Publish each request's claim (concurrently) and tell who won; see :mod:`._claims`.
        Won claims are announced (:meth:`subscribe_claims`), a batch's while it goes on; a
        claim of a slot another instance was heard winning is answered lost, unpublished.

        A batch that fails raises, but keeps the answers it decided for the scheduler's retry
        of the same requests (same tokens); a win it kept that the scheduler never asks for
        again is closed as skipped, never left ``running``."""
        return await self._claims.claim(requests)

    async def _announce(self, notices: Sequence[ClaimNotice]) -> None:
        """Publish claim notices on core NATS (after the acks: only decided wins), in messages
        of at most :data:`NOTICES_PER_MESSAGE`, written with the publishes of the same
        event-loop turn (:meth:`._connection.Connection.send`: a one-slot claim's notice goes
        out with the next claim's publish). Best effort: a lost notice costs another instance a
        losing claim, never a run."""
        subject = self._claimed_subject
        try:
            for at in range(0, len(notices), NOTICES_PER_MESSAGE):
                chunk = notices[at : at + NOTICES_PER_MESSAGE]
                body = encode_notice(chunk[0]) if len(chunk) == 1 else notices_message(chunk)
                await self._conn.send(subject, body.encode())
        except Exception as exc:  # the connection is down: the claims themselves were acked
            self._feed.logger.debug("claim notices not sent: %s", exc)

    async def finish(
        self, ticket: Ticket, status: str, error: str | None, retry: RunRequest | None = None
    ) -> Run:
        """Publish the run's result to ``<prefix><job>.results`` (once, by message id).

        A scheduled run's non-duplicate ack is answered from what was published, with no
        further call: the run returned starts at the ticket's start and ends on this instance's
        clock (history shows the stream's timestamps). A manual run's result (what run_now()
        returns) and a duplicate ack read the stored result and the claim back (one round
        trip): the stored run, or LeaseLost if the slot has another run's result.

        A ``retry`` is stored first, then the result (:meth:`finish_many`).
        """
        [answer] = await self.finish_many([FinishRequest(ticket, RunStatus(status), error, retry)])
        if isinstance(answer, BackendError):
            raise answer
        return answer

    async def finish_many(self, items: Sequence[FinishRequest]) -> list[Run | BackendError]:
        """See :meth:`anarchon.backend.Backend.finish_many`: each result published as
        :meth:`finish` does, up to 64 in flight at once.

        The result goes to the stream and its retry to the control bucket: JetStream cannot
        write both in one step. So each retry is stored first (a ``create``, once per id) and
        its result only after: a process that dies in between leaves the retry stored and the
        run ``running`` (as a crashed run stays on a broker), never a ``failed`` slot without
        its retry. A retry that cannot be stored holds its result back (unavailable: the whole
        call fails and the core sends both again). A result refused after its retry was stored
        (the slot already has another run's result, which only a second claim of one slot key
        can cause) leaves that retry; a retry stored twice is claimed once."""
        refused = await retries_first(self._control, items)
        sent = [
            FinishRequest(item.ticket, item.status, item.error)
            for n, item in enumerate(items)
            if n not in refused
        ]
        answers = iter(await self._claims.results.finish_many(sent) if sent else [])
        return [refused[n] if n in refused else next(answers) for n in range(len(items))]

    async def history(self, job: str, limit: int = 100) -> list[Run]:
        """Claims and results of ``job`` combined, newest first; a claim without a result is
        ``running``. Reads the job's two subjects only (at most 2 x history_size messages)."""
        self._conn.require()
        check_name(job)
        if limit <= 0:
            return []
        messages = await self._conn.read_all(
            subjects.JOB.format(prefix=self.prefix, job=job), f"reading history of {job}"
        )
        return records.merge(messages, self.prefix, job)[:limit]

    async def last_run(self, job: str) -> Run | None:
        """The newest claim of ``job`` with its result, in a few reads by subject."""
        self._conn.require()
        check_name(job)
        newest = await self._conn.get_retrying(
            {"last_by_subj": subjects.CLAIMS.format(prefix=self.prefix, job=job)},
            f"reading last claim of {job}",
        )
        claim = records.decode_claim(newest) if newest is not None else None
        if claim is None:
            runs = await self.history(job, limit=1)
            return runs[0] if runs else None
        if claim.skipped:
            return claim.run()
        results_subject = subjects.RESULTS.format(prefix=self.prefix, job=job)
        after = claim.seq + 1
        for _ in range(LAST_RUN_SCAN):
            found = await self._conn.get_retrying(
                {"seq": after, "next_by_subj": results_subject}, f"reading results of {job}"
            )
            if found is None:
                return claim.run()
            result = records.decode_result(found)
            if result is not None and result.run.run_id == claim.run_id:
                return records.finished(claim.run(), result.run)
            after = found.seq + 1
        runs = await self.history(job, limit=1)
        return runs[0] if runs else None

    async def histories(self, jobs: Sequence[str], limit: int = 100) -> dict[str, list[Run]]:
        """See :meth:`anarchon.backend.Backend.histories`: the jobs' subjects read with one
        consumer when that reads few messages more than a consumer per job would (the stream's
        info tells); else a consumer per job that holds messages (see ``_histories``)."""
        self._conn.require()
        names = list(dict.fromkeys(jobs))
        for job in names:
            check_name(job)
        if limit <= 0 or not names:
            return {job: [] for job in names}

        async def each(asked: Sequence[str]) -> dict[str, list[Run]]:
            return await Backend.histories(self, asked, limit)

        return await read_histories(self._conn, self.stream, self.prefix, names, limit, each)

    async def server_time_ms(self) -> int | None:
        """The stream leader's clock: the ``ts`` of a stream info answer (nats-server 2.10+),
        else the timestamp JetStream stamps on a probe message (deleted right after)."""
        return await self._conn.server_time_ms(subjects.CLOCK.format(prefix=self.prefix))

    async def last_slots(self, jobs: Sequence[str]) -> dict[str, int | None]:
        """The slot of each job's newest claim of a scheduled or catch-up slot (a claim, or a
        skip record); None when the job has none.

        The stream's info lists the claim subjects that hold a message (one request, or one
        per page of subjects); only those jobs' newest claims are read, one read per job, so
        100 000 new jobs cost no read at all. A job whose newest claim is a manual run or a
        retry has its claims read (at most ``history_size``), for the newest slot's."""
        self._conn.require()
        for job in jobs:
            check_name(job)
        listed = set(
            await self._conn.retry(
                lambda _: self._conn.subjects(
                    self.stream, subjects.CLAIMS.format(prefix=self.prefix, job="*")
                ),
                "listing the jobs' claim subjects",
                self._conn.retry_deadline(),
            )
        )
        claimed = [j for j in jobs if subjects.CLAIMS.format(prefix=self.prefix, job=j) in listed]
        gate = asyncio.Semaphore(LAST_SLOTS_AT_ONCE)

        async def one(job: str) -> int | None:
            claims = subjects.CLAIMS.format(prefix=self.prefix, job=job)
            async with gate:
                newest = await self._conn.get_retrying(
                    {"last_by_subj": claims}, f"reading last claim of {job}"
                )
                claim = records.decode_claim(newest) if newest is not None else None
                if claim is None:
                    return None
                slot = records.slot_of(claim)
                if slot is not None:
                    return slot
                # A manual run or a retry: the newest slot is that of an earlier claim.
                stored = await self._conn.read_all(claims, f"reading the claims of {job}")
            found = (records.slot_of(c) for c in map(records.decode_claim, stored) if c is not None)
            return max((s for s in found if s is not None), default=None)

        slots = await asyncio.gather(*(one(job) for job in claimed))
        return {**dict.fromkeys(jobs), **dict(zip(claimed, slots, strict=True))}

    async def subscribe_claims(self, on_claims: ClaimListener) -> bool:
        """Call ``on_claims`` with the notices every instance publishes on
        ``_anarchon.<stream>.claimed`` (``_anarchon.<stream>.<prefix>claimed`` under a prefix
        other than ``cron.``) after its claims are acked (core NATS; the client
        subscribes again by itself after a reconnect). Each message is handed over as nats-py's
        parser reads it (:func:`._wire.subscribe_raw`): listeners must not block."""
        self._feed.add_claims(on_claims)
        if self._claimed is None:
            nc, _ = self._conn.require()
            feed = self._feed

            claims = self._claims

            def heard(subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
                notices = decode_notices(data, feed.logger)
                claims.hear(notices)
                feed.dispatch_claims(notices)

            self._claimed = await subscribe_raw(nc, self._claimed_subject, heard)
            with contextlib.suppress(Exception):  # the subscription reaches the server first
                await nc.flush(timeout=2)
        return True

    def registry(self) -> NatsRegistry:
        """The registry, in a key-value bucket beside the stream (see ``_registry``)."""
        return NatsRegistry(self)

    def control(self) -> NatsControl:
        """Pauses and run requests, in a key-value bucket beside the stream (see ``_control``:
        the claim reads pauses before it publishes, not atomically with it)."""
        return self._control

    # -- NATS only: the duplicate window ----------------------------------------------------

    @staticmethod
    def need_ms(policy: JobPolicy) -> int:
        """How long the stream must remember a slot's claim for this job: ``jitter_ms +
        max_late_ms`` plus :data:`._timings.CLAIM_MARGIN_MS` for claim retries past
        ``max_late_ms``."""
        return Window.need_ms(policy)

    @property
    def window_ms(self) -> int:
        """The duplicate window jobs are checked against: the stream's own once started, this
        instance's ``duplicate_window_ms`` (the least it will keep on the stream) before."""
        return self._window.ms

    async def check_window(self) -> int | None:
        """Read the stream's duplicate window now (the backend does it every minute) and return
        it (None: the stream is gone).

        If it fell below what this instance keeps, ``duplicate_window_ms`` or, for a job added
        after start() against a longer window, that job's need (another instance shrank it with
        ``shrink_window=True``), raise it back and log a warning naming the job.
        """
        return await self._window.check()
