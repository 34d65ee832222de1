"""NatsBackend: JetStream's message de-duplication decides who runs each slot.

Every instance publishes its claim for a slot to ``<prefix><job>.claims`` with the header
``Nats-Msg-Id: <job>:<slot>``. Within the stream's duplicate window JetStream stores only the
first message with an id and answers every later one ``duplicate: true`` with the first one's
sequence; the stream leader orders publishes, so exactly one is first. A non-duplicate ack
wins. A duplicate ack is resolved by reading the stored message by sequence and comparing
tokens, so a publish the client retried (lost ack, timeout, reconnect) still counts as its own.

This is a broker: no leases, so no backup runners, overlap protection, catch-up or hand-over
(``capabilities`` is empty and the core rejects those options when a job is added).
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Final, TypeVar
from urllib.parse import parse_qs, urlsplit

from ..._job import check_name
from ..._models import Run, RunStatus, ms_to_datetime
from ..._redact import redact_url as _redact
from ...backend import Backend, ClaimOutcome, ClaimRequest, ClaimStatus, JobPolicy, Ticket
from ...errors import (
    BackendError,
    BackendUnavailable,
    InvalidOption,
    LeaseLost,
    MissingDependency,
)
from . import _errors as errors
from . import _records as records
from . import _stream as stream_setup
from . import _subjects as subjects
from ._errors import InFlight, JetStreamError
from ._records import Claim, Stored

if TYPE_CHECKING:
    from nats.aio.client import Client as NATS
    from nats.js import JetStreamContext
    from nats.js.api import PubAck

__all__ = ["NatsBackend"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_SERVERS: Final = "nats://localhost:4222"
# Connecting: a few quick tries per server so start() fails within seconds; once connected the
# client reconnects forever, every half second, and pings every 10 s so a dead TCP connection
# is noticed in about 30 s instead of nats-py's default of several minutes.
CONNECT_TIMEOUT_S: Final = 2.0
CONNECT_ATTEMPTS: Final = 2
RECONNECT_WAIT_S: Final = 0.5
PING_INTERVAL_S: Final = 10
MAX_OUTSTANDING_PINGS: Final = 3
# One request (publish, get, API call) waits this long for its answer; a failover takes a few
# seconds of "no responders", so a claim is retried with the same id and token for up to
# CLAIM_RETRY_S, with short pauses (an in-flight duplicate is settled in tens of ms).
REQUEST_TIMEOUT_S: Final = 2.0
CLAIM_RETRY_S: Final = 8.0
START_RETRY_S: Final = 10.0
RETRY_FIRST_S: Final = 0.025
RETRY_CAP_S: Final = 0.5
MAX_ATTEMPTS: Final = 12
# Claims of one batch in flight at once: enough to fill the pipe, bounded so a batch of
# thousands does not overflow nats-py's reconnect buffer.
MAX_IN_FLIGHT: Final = 256
FETCH_BATCH: Final = 500
CONSUMER_INACTIVE_S: Final = 30.0
# last_run() looks at most this many results after the newest claim before reading the job.
LAST_RUN_SCAN: Final = 32
# A skip record is published only while its slot's claim id is surely still remembered.
SKIP_SAFETY_MS: Final = 30_000
URL_OPTIONS: Final = ("stream", "prefix", "duplicate_window_ms", "history_size", "replicas")


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _import_nats() -> Any:
    try:
        import nats
        import nats.errors
        import nats.js.api
    except ImportError as exc:
        raise MissingDependency(
            "NatsBackend needs the nats-py client: pip install 'anarchon[nats]'"
        ) from exc
    return nats


def _where(nc: NATS) -> str:
    """host:port of the server a client is connected to (never its credentials)."""
    url = nc.connected_url
    return f"{url.hostname}:{url.port}" if url is not None else "?"


def _positive(option: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidOption(f"{option}={value!r} must be an integer >= {minimum}")
    return value


class NatsBackend(Backend):
    """Claims and history in a NATS JetStream stream; one winner per slot by de-duplication.

    :param servers: one URL or a list (``nats://host:4222``, ``tls://...``); ignored when
        ``connection`` is given.
    :param connection: your own connected nats-py client; you keep ownership (``stop()`` never
        closes it).
    :param stream: the JetStream stream name.
    :param prefix: the subject prefix; a job's subjects are ``<prefix><job>.claims`` and
        ``<prefix><job>.results``.
    :param duplicate_window_ms: how long JetStream remembers a claimed run; every job's
        ``jitter_ms + max_late_ms`` must be less.
    :param history_size: roughly how many runs are kept per job, at least (the stream's
        per-subject limit).
    :param replicas: replicas of the stream in a NATS cluster; 1 for a new stream when not
        given, and an existing stream keeps its own unless given.
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
    ) -> None:
        _import_nats()
        if isinstance(servers, str):
            servers = [servers]
        if not servers or not all(isinstance(s, str) and s.strip() for s in servers):
            raise InvalidOption(
                f"servers={_redact(repr(servers))} must be a NATS URL or a non-empty list"
            )
        if connection is not None and not callable(getattr(connection, "jetstream", None)):
            raise InvalidOption(f"connection={connection!r} is not a nats-py client (nats.connect)")
        self.servers: list[str] = [s.strip() for s in servers]
        self.stream = subjects.check_stream(stream)
        self.prefix = subjects.check_prefix(prefix)
        self.duplicate_window_ms = _positive("duplicate_window_ms", duplicate_window_ms, 100)
        self.history_size = _positive("history_size", history_size, 1)
        if replicas is not None and (_positive("replicas", replicas, 1) > 5):
            raise InvalidOption(
                f"replicas={replicas!r} must be between 1 and 5 (JetStream's limit)"
            )
        self.replicas = replicas
        self._connection = connection
        self._nc: NATS | None = None
        self._js: JetStreamContext | None = None
        self._in_flight: asyncio.Semaphore | None = None
        self._stream_has_ts: bool | None = None
        self._down = False
        self._connecting = False
        self._connect_error: Exception | None = None

    def __repr__(self) -> str:
        where = (
            "connection=<yours>"
            if self._connection is not None
            else repr([_redact(s) for s in self.servers])
        )
        return f"NatsBackend({where}, stream={self.stream!r}, prefix={self.prefix!r})"

    @classmethod
    def from_url(cls, url: str) -> NatsBackend:
        """Build from ``nats://host:4222?stream=CRON&prefix=cron.&duplicate_window_ms=300000``.

        Several servers: ``nats://n1:4222,n2:4222,n3:4222?...`` or repeated ``server=`` query
        parameters (full URLs). Also ``history_size`` and ``replicas``; ``tls://`` works too.
        """
        parts, shown = urlsplit(url), _redact(url)
        if parts.scheme.lower() not in ("nats", "tls"):
            raise InvalidOption(f"backend URL {shown!r} is not a nats:// or tls:// URL")
        if parts.path not in ("", "/"):
            raise InvalidOption(
                f"backend URL {shown!r} has a path {parts.path!r}; NATS URLs take options as query "
                "parameters: nats://host:4222?stream=CRON&prefix=cron."
            )
        userinfo, _, hosts = parts.netloc.rpartition("@")
        auth = f"{userinfo}@" if userinfo else ""
        servers = [f"{parts.scheme}://{auth}{h}" for h in hosts.split(",") if h.strip()]
        params = parse_qs(parts.query, keep_blank_values=True)
        servers += params.pop("server", [])
        unknown = sorted(set(params) - set(URL_OPTIONS))
        if unknown:
            raise InvalidOption(
                f"backend URL {shown!r} has unknown option(s) {', '.join(unknown)}; NATS URLs "
                f"take {', '.join(URL_OPTIONS)} and server"
            )
        options: dict[str, Any] = {}
        for key, values in params.items():
            value = values[-1]
            if key in ("stream", "prefix"):
                options[key] = value
                continue
            try:
                options[key] = int(value)
            except ValueError:
                raise InvalidOption(
                    f"backend URL {shown!r}: {key}={value!r} must be an integer"
                ) from None
        if not servers:
            raise InvalidOption(f"backend URL {shown!r} names no server (nats://host:4222)")
        return cls(servers, **options)

    # -- life cycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Connect (unless given a connection) and create or update the stream. Idempotent.

        Raises :class:`~anarchon.errors.BackendError` within seconds, saying what is wrong and
        how to fix it: server unreachable, JetStream not enabled (``nats-server -js``), a stream
        or prefix the server refuses.
        """
        await self._open(read_only=False)

    async def start_reader(self) -> None:
        """Connect to read history only: the stream must exist and is left exactly as it is."""
        await self._open(read_only=True)

    async def _open(self, *, read_only: bool) -> None:
        if self._nc is not None:
            return
        nc = self._connection if self._connection is not None else await self._connect()
        self._nc = nc
        self._js = nc.jetstream(timeout=REQUEST_TIMEOUT_S)
        self._in_flight = asyncio.Semaphore(MAX_IN_FLIGHT)
        try:
            await self._prepare_stream(nc, read_only=read_only)
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        """Close the connection this backend opened; never one you passed in."""
        nc, self._nc, self._js = self._nc, None, None
        if nc is not None and nc is not self._connection and not nc.is_closed:
            await nc.close()

    async def _connect(self) -> NATS:
        nats = _import_nats()
        self._connecting = True
        try:
            nc: NATS = await nats.connect(
                servers=self.servers,
                name="anarchon",
                connect_timeout=CONNECT_TIMEOUT_S,
                reconnect_time_wait=RECONNECT_WAIT_S,
                max_reconnect_attempts=CONNECT_ATTEMPTS,
                ping_interval=PING_INTERVAL_S,
                max_outstanding_pings=MAX_OUTSTANDING_PINGS,
                error_cb=self._on_error,
                disconnected_cb=self._on_disconnected,
                reconnected_cb=self._on_reconnected,
            )
        except (OSError, TimeoutError, nats.errors.Error) as exc:
            cause = self._connect_error if self._connect_error is not None else exc
            raise BackendError(
                f"cannot connect to NATS at {', '.join(map(_redact, self.servers))}: "
                f"{errors.describe(cause)}. Check that nats-server runs there, with JetStream "
                "enabled (nats-server -js), and that the URL is right"
            ) from exc
        finally:
            self._connecting = False
        # The first connection fails fast; from now on a lost connection is retried forever.
        nc.options["max_reconnect_attempts"] = -1
        return nc

    async def _on_error(self, exc: Exception) -> None:
        # nats-py calls this for every failed (re)connect attempt and for the loss that starts
        # an outage; _on_disconnected says it once per outage, so those stay at debug level.
        import nats.errors

        if self._connecting:
            self._connect_error = exc
        lost = isinstance(exc, OSError | nats.errors.StaleConnectionError)
        if self._connecting or self._down or lost:
            logger.debug("NATS: %s", errors.describe(exc), extra={"action": "nats_error"})
        else:
            logger.warning("NATS: %s", errors.describe(exc), extra={"action": "nats_error"})

    async def _on_disconnected(self) -> None:
        if self._down or self._connecting or self._nc is None:
            return
        self._down = True
        logger.warning(
            "disconnected from NATS; reconnecting every %.1f s (claims fail closed meanwhile)",
            RECONNECT_WAIT_S,
            extra={"action": "nats_disconnected"},
        )

    async def _on_reconnected(self) -> None:
        self._down = False
        nc = self._nc
        url = _where(nc) if nc is not None else "?"
        logger.warning("reconnected to NATS at %s", url, extra={"action": "nats_reconnected"})

    async def _prepare_stream(self, nc: NATS, *, read_only: bool = False) -> None:
        wanted = stream_setup.Wanted(
            stream=self.stream,
            prefix=self.prefix,
            duplicate_window_ms=self.duplicate_window_ms,
            history_size=self.history_size,
            replicas=self.replicas,
        )
        deadline = asyncio.get_running_loop().time() + START_RETRY_S
        while True:
            try:
                if read_only:
                    info = await stream_setup.require(self._api, wanted.stream)
                else:
                    info = await stream_setup.ensure(self._api, wanted)
                break
            except Exception as exc:
                self._explain_no_jetstream(nc, exc)
                if not errors.is_transient(exc) or asyncio.get_running_loop().time() > deadline:
                    raise errors.translate(exc, f"preparing stream {self.stream!r}") from exc
                await asyncio.sleep(0.25)
        self._stream_has_ts = "ts" in info

    def _explain_no_jetstream(self, nc: NATS, exc: Exception) -> None:
        import nats.errors

        no_answer = isinstance(exc, nats.errors.NoRespondersError)
        disabled = isinstance(exc, JetStreamError) and exc.err_code in (
            errors.JETSTREAM_NOT_ENABLED,
            errors.JETSTREAM_NOT_ENABLED_FOR_ACCOUNT,
        )
        server_info: dict[str, Any] = getattr(nc, "_server_info", None) or {}
        if disabled or (no_answer and not server_info.get("jetstream")):
            url = _where(nc)
            raise BackendError(
                f"JetStream is not enabled on the NATS server at {url}: NatsBackend needs it. "
                "Start the server with JetStream enabled (nats-server -js, or a 'jetstream {}' "
                "block in its configuration)"
            ) from exc

    # -- plumbing ---------------------------------------------------------------------------

    def _require(self) -> tuple[NATS, JetStreamContext, asyncio.Semaphore]:
        if self._nc is None or self._js is None or self._in_flight is None:
            raise BackendError(f"{self!r} is not started; start the scheduler first")
        return self._nc, self._js, self._in_flight

    async def _api(
        self, subject: str, body: dict[str, Any] | None, wait_s: float = REQUEST_TIMEOUT_S
    ) -> dict[str, Any]:
        """One JetStream API request with the server's own JSON; errors as JetStreamError."""
        nc, _, _ = self._require()
        payload = b"" if body is None else json.dumps(body).encode()
        reply = await nc.request(subject, payload, timeout=wait_s)
        try:
            answer = json.loads(reply.data)
        except ValueError as exc:
            raise BackendError(
                f"NATS: unreadable answer to {subject}: {reply.data[:200]!r}"
            ) from exc
        if not isinstance(answer, dict):
            raise BackendError(f"NATS: unexpected answer to {subject}: {reply.data[:200]!r}")
        if "error" in answer:
            raise errors.api_error(answer["error"])
        return answer

    async def _retry(
        self,
        call: Callable[[float], Awaitable[T]],
        doing: str,
        deadline: float,
        fields: dict[str, Any] | None = None,
    ) -> T:
        """Run ``call(wait_s)`` until it succeeds, retrying transient failures until
        ``deadline`` (event-loop time) or MAX_ATTEMPTS; then raise BackendUnavailable."""
        loop = asyncio.get_running_loop()
        attempt = 0
        while True:
            attempt += 1
            timeout = max(0.25, min(REQUEST_TIMEOUT_S, deadline - loop.time()))
            try:
                return await call(timeout)
            except Exception as exc:
                if not errors.is_transient(exc):
                    raise errors.translate(exc, doing) from exc
                delay = min(RETRY_CAP_S, RETRY_FIRST_S * 2 ** (attempt - 1))
                delay *= 0.5 + random.random() / 2
                if attempt >= MAX_ATTEMPTS or loop.time() + delay >= deadline:
                    raise errors.translate(exc, doing) from exc
                logger.debug(
                    "NATS: %s: %s; retrying (attempt %d)",
                    doing,
                    errors.describe(exc),
                    attempt,
                    extra={**(fields or {}), "action": "nats_retry"},
                )
            await asyncio.sleep(delay)

    async def _publish(
        self, subject: str, payload: bytes, msg_id: str | None, wait_s: float
    ) -> PubAck:
        _, js, _ = self._require()
        headers = {subjects.MSG_ID: msg_id} if msg_id is not None else None
        ack = await js.publish(subject, payload, timeout=wait_s, headers=headers)
        if ack.duplicate and not ack.seq:
            raise InFlight()
        return ack

    async def _get(self, request: dict[str, Any], wait_s: float) -> Stored | None:
        """Read one message (by ``seq``, ``last_by_subj`` or ``next_by_subj``) from the stream
        leader; None if there is none."""
        try:
            answer = await self._api(subjects.api("STREAM.MSG.GET", self.stream), request, wait_s)
        except JetStreamError as exc:
            if exc.err_code == errors.NO_MESSAGE:
                return None
            raise
        import base64

        message = answer["message"]
        return Stored(
            seq=int(message["seq"]),
            subject=str(message["subject"]),
            time_ms=records.parse_time_ms(str(message["time"])),
            data=base64.b64decode(message.get("data") or ""),
        )

    async def _get_retrying(self, request: dict[str, Any], doing: str) -> Stored | None:
        deadline = asyncio.get_running_loop().time() + CLAIM_RETRY_S
        return await self._retry(lambda t: self._get(request, t), doing, deadline)

    # -- jobs -------------------------------------------------------------------------------

    def check_job(self, policy: JobPolicy) -> None:
        """Require ``jitter_ms + max_late_ms < duplicate_window_ms``."""
        late = policy.jitter_ms + policy.max_late_ms
        if late >= self.duplicate_window_ms:
            raise InvalidOption(
                f"job {policy.name!r}: jitter_ms + max_late_ms = {policy.jitter_ms} + "
                f"{policy.max_late_ms} = {late} must be less than the NATS backend's "
                f"duplicate_window_ms={self.duplicate_window_ms}: outside that window JetStream "
                "no longer recognises a repeated claim and a very late instance could run the "
                "slot again. Lower max_late_ms or raise duplicate_window_ms"
            )

    def skew_budget_ms(self, policy: JobPolicy) -> int | None:
        """The duplicate window less ``jitter_ms + max_late_ms``."""
        return self.duplicate_window_ms - (policy.jitter_ms + policy.max_late_ms)

    # -- claims -----------------------------------------------------------------------------

    async def claim(self, requests: Sequence[ClaimRequest]) -> list[ClaimOutcome]:
        """Publish each request's claim (concurrently) and tell who won; see the module doc."""
        _, _, gate = self._require()
        failed: list[BackendUnavailable] = []

        async def one(req: ClaimRequest) -> ClaimOutcome:
            async with gate:
                if failed:  # the backend is down: fail the rest of the batch at once
                    raise failed[0]
                try:
                    return await self._claim_one(req)
                except BackendUnavailable as exc:
                    failed.append(exc)
                    raise

        answers = await asyncio.gather(*(one(r) for r in requests), return_exceptions=True)
        problems = [a for a in answers if isinstance(a, BaseException)]
        if problems:
            permanent = [p for p in problems if not isinstance(p, BackendUnavailable)]
            raise (permanent or problems)[0]
        return [a for a in answers if isinstance(a, ClaimOutcome)]

    async def _claim_one(self, req: ClaimRequest) -> ClaimOutcome:
        now = _now_ms()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CLAIM_RETRY_S
        if req.slot is not None:
            # Never publish a claim whose id JetStream may have forgotten: it would be stored.
            margin = SKIP_SAFETY_MS if req.skip_reason is not None else 0
            safe_ms = (
                req.slot + self.duplicate_window_ms - min(margin, self.duplicate_window_ms // 4)
            )
            if req.skip_reason is not None and now >= safe_ms:
                return self._unrecorded_skip(req, now)
            deadline = min(deadline, loop.time() + (safe_ms - now) / 1000)
        msg_id = subjects.claim_id(req.job, req.slot_key)
        subject = subjects.claims(self.prefix, req.job)
        payload = records.encode_claim(req)
        ack = await self._retry(
            lambda t: self._publish(subject, payload, msg_id, t),
            f"claiming {msg_id}",
            deadline,
            {"job": req.job, "slot": req.slot},
        )
        stored = await self._get_retrying({"seq": ack.seq}, f"reading claim {msg_id}")
        if stored is None:
            if ack.duplicate:
                return self._gone(req, ack.seq)
            # Ours, and already trimmed by the per-subject limit: still ours.
            stored_claim = records.claim_of_request(req, ack.seq, _now_ms())
        else:
            decoded = records.decode_claim(stored)
            if decoded is None:
                raise BackendError(
                    f"NATS: message {stored.seq} on {stored.subject} has the claim id {msg_id} "
                    "but is not an anarchon claim; is something else publishing under prefix "
                    f"{self.prefix!r}?"
                )
            stored_claim = decoded
        if ack.duplicate:
            logger.debug(
                "claim %s is a duplicate of seq %d (%s)",
                msg_id,
                ack.seq,
                "ours: a retried publish" if stored_claim.token == req.token else "another's",
                extra={"job": req.job, "slot": req.slot, "action": "claim_duplicate"},
            )
        return self._answer(req, stored_claim)

    @staticmethod
    def _answer(req: ClaimRequest, claim: Claim) -> ClaimOutcome:
        run = claim.run()
        if claim.skipped:
            return ClaimOutcome(status=ClaimStatus.SKIPPED, run=run)
        if claim.token == req.token:
            ticket = claim.ticket()
            return ClaimOutcome(
                status=ClaimStatus.WON, run=run, ticket=ticket, backend_now_ms=claim.time_ms
            )
        return ClaimOutcome(status=ClaimStatus.LOST, run=run)

    def _gone(self, req: ClaimRequest, seq: int) -> ClaimOutcome:
        """A duplicate of a claim the per-subject limit already removed: lost, nobody to ask."""
        claim = records.claim_of_request(req, seq, _now_ms())
        run = claim.run()
        gone = Run(
            job=run.job,
            slot=run.slot,
            run_id=run.run_id,
            instance=run.instance,
            trigger=run.trigger,
            attempt=1,
            status=RunStatus.SKIPPED,
            started_at=run.started_at,
            finished_at=run.started_at,
            reason=(
                f"lost: the winning claim (seq {seq}) was already trimmed from stream "
                f"{self.stream!r} (history_size={self.history_size})"
            ),
        )
        return ClaimOutcome(status=ClaimStatus.LOST, run=gone)

    def _unrecorded_skip(self, req: ClaimRequest, now: int) -> ClaimOutcome:
        started = ms_to_datetime(now)
        assert started is not None
        run = Run(
            job=req.job,
            slot=ms_to_datetime(req.slot),
            run_id=req.run_id,
            instance=req.instance,
            trigger=req.trigger,
            attempt=1,
            status=RunStatus.SKIPPED,
            started_at=started,
            finished_at=started,
            reason=(
                f"{req.skip_reason}; not recorded: the slot is too close to the end of the "
                f"duplicate window (duplicate_window_ms={self.duplicate_window_ms}), where a "
                "record could no longer be told apart from the slot's claim"
            ),
        )
        return ClaimOutcome(status=ClaimStatus.SKIPPED, run=run)

    # -- results ----------------------------------------------------------------------------

    async def finish(self, ticket: Ticket, status: str, error: str | None) -> Run:
        """Publish the run's result to ``<prefix><job>.results`` (once, by message id)."""
        self._require()
        outcome = RunStatus(status)
        msg_id = subjects.result_id(ticket.job, ticket.slot_key)
        subject = subjects.results(self.prefix, ticket.job)
        payload = records.encode_result(ticket, outcome, error)
        deadline = asyncio.get_running_loop().time() + CLAIM_RETRY_S
        ack = await self._retry(
            lambda t: self._publish(subject, payload, msg_id, t), f"recording {msg_id}", deadline
        )
        stored = await self._get_retrying({"seq": ack.seq}, f"reading result {msg_id}")
        result = records.decode_result(stored) if stored is not None else None
        if ack.duplicate and result is not None and result.run.run_id != ticket.run_id:
            raise LeaseLost(
                f"run {ticket.run_id} of job {ticket.job!r}: slot {ticket.slot_key} already has "
                f"a result from run {result.run.run_id}; this one is refused"
            )
        started = ms_to_datetime(ticket.started_at_ms)
        assert started is not None
        return Run(
            job=ticket.job,
            slot=ms_to_datetime(ticket.slot),
            run_id=ticket.run_id,
            instance=ticket.instance,
            trigger=ticket.trigger,
            attempt=1,
            status=outcome,
            started_at=started,
            finished_at=ms_to_datetime(stored.time_ms if stored is not None else _now_ms()),
            error=error,
            fence=ticket.fence,
        )

    # -- history ----------------------------------------------------------------------------

    async def history(self, job: str, limit: int = 100) -> list[Run]:
        """Claims and results of ``job`` combined, newest first; a claim without a result is
        ``running``. Reads the job's two subjects only (at most 2 x history_size messages)."""
        self._require()
        check_name(job)
        if limit <= 0:
            return []
        messages = await self._read_job(job)
        return records.merge(messages, self.prefix, job)[:limit]

    async def last_run(self, job: str) -> Run | None:
        """The newest claim of ``job`` with its result, in a few reads by subject."""
        self._require()
        check_name(job)
        newest = await self._get_retrying(
            {"last_by_subj": subjects.claims(self.prefix, job)}, f"reading last claim of {job}"
        )
        claim = records.decode_claim(newest) if newest is not None else None
        if claim is None:
            runs = await self.history(job, limit=1)
            return runs[0] if runs else None
        if claim.skipped:
            return claim.run()
        results_subject = subjects.results(self.prefix, job)
        after = claim.seq + 1
        for _ in range(LAST_RUN_SCAN):
            found = await self._get_retrying(
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

    async def _read_job(self, job: str) -> list[Stored]:
        deadline = asyncio.get_running_loop().time() + CLAIM_RETRY_S
        return await self._retry(
            lambda t: self._read_once(job), f"reading history of {job}", deadline
        )

    async def _read_once(self, job: str) -> list[Stored]:
        """Every message on ``<prefix><job>.*`` through a short-lived ephemeral pull consumer
        (one wildcard filter: nats-server 2.9 ignores multi-subject filters)."""
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

        _, js, _ = self._require()
        name = f"anarchon_{uuid.uuid4().hex}"
        config = ConsumerConfig(
            name=name,
            ack_policy=AckPolicy.NONE,
            deliver_policy=DeliverPolicy.ALL,
            filter_subject=subjects.job_filter(self.prefix, job),
            inactive_threshold=CONSUMER_INACTIVE_S,
            mem_storage=True,
        )
        info = await js.add_consumer(self.stream, config=config)
        try:
            pending = info.num_pending or 0
            if pending == 0:
                return []
            sub = await js.pull_subscribe_bind(consumer=name, stream=self.stream)
            try:
                return await self._drain(sub, pending)
            finally:
                await sub.unsubscribe()
        finally:
            await self._forget_consumer(name)

    @staticmethod
    async def _drain(sub: JetStreamContext.PullSubscription, pending: int) -> list[Stored]:
        out: list[Stored] = []
        left = pending
        while left > 0 and len(out) < pending:
            batch = await sub.fetch(min(FETCH_BATCH, pending - len(out)), timeout=REQUEST_TIMEOUT_S)
            if not batch:
                break
            for msg in batch:
                fields = records.ack_fields(msg.reply or "")
                if fields is None:
                    continue
                seq, time_ms, left = fields
                out.append(Stored(seq=seq, subject=msg.subject, time_ms=time_ms, data=msg.data))
        return out

    async def _forget_consumer(self, name: str) -> None:
        js = self._js
        if js is None:
            return
        try:
            await js.delete_consumer(self.stream, name)
        except Exception as exc:  # it expires by itself after CONSUMER_INACTIVE_S
            logger.debug("could not delete consumer %s: %s", name, errors.describe(exc))

    # -- clock ------------------------------------------------------------------------------

    async def server_time_ms(self) -> int | None:
        """The stream leader's clock: the ``ts`` of a stream info answer (nats-server 2.10+),
        else the timestamp JetStream stamps on a probe message (deleted right after)."""
        self._require()
        deadline = asyncio.get_running_loop().time() + REQUEST_TIMEOUT_S * 2
        try:
            if self._stream_has_ts is not False:
                info = await self._retry(
                    lambda t: self._api(subjects.api("STREAM.INFO", self.stream), None, t),
                    "reading the server's clock",
                    deadline,
                )
                if "ts" in info:
                    self._stream_has_ts = True
                    return records.parse_time_ms(str(info["ts"]))
                self._stream_has_ts = False
            return await self._probe_clock(deadline)
        except BackendUnavailable:
            raise
        except BackendError as exc:
            logger.warning("cannot read the NATS server's clock: %s", exc)
            return None

    async def _probe_clock(self, deadline: float) -> int | None:
        subject = subjects.clock(self.prefix)
        ack = await self._retry(
            lambda t: self._publish(subject, b"", None, t), "probing the server's clock", deadline
        )
        stored = await self._get_retrying({"seq": ack.seq}, "reading the clock probe")
        try:
            await self._api(
                subjects.api("STREAM.MSG.DELETE", self.stream), {"seq": ack.seq, "no_erase": True}
            )
        except Exception as exc:  # bounded anyway by the per-subject limit
            logger.debug("could not delete clock probe %d: %s", ack.seq, errors.describe(exc))
        return stored.time_ms if stored is not None else None
