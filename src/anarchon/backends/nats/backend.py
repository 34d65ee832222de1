"""NatsBackend: JetStream's message de-duplication decides who runs each slot.

Every instance publishes its claim for a slot to ``<prefix><job>.claims`` with the header
``Nats-Msg-Id: <job>:<slot>``. Within the stream's duplicate window JetStream stores only the
first message with an id and answers every later one ``duplicate: true`` with the first one's
sequence; the stream leader orders publishes, so exactly one is first. A non-duplicate ack
wins, with no further call: the ack is the proof. A duplicate ack is resolved by reading the
stored message by sequence and comparing tokens, so a publish the client retried (lost ack,
timeout, reconnect) still counts as its own.

The duplicate window is the stream's, shared by every instance: each instance grows it to its
own ``duplicate_window_ms`` and never shrinks it (unless ``shrink_window=True``), and checks its
jobs against the window the stream really has (see :meth:`NatsBackend.check_job`).

This is a broker: no leases, so no backup runners, overlap protection, catch-up or hand-over
(``capabilities`` is empty and the core rejects those options when a job is added).
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import ssl
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Final, TypeVar

from ..._job import check_name
from ..._models import Run, RunStatus, ms_to_datetime
from ..._redact import redact_url
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
from ._connect import Access, parse_url, scrub, servers_shown, url_secrets
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
# How late past max_late_ms a claim can reach the stream. The core sends a scheduled claim only
# while the slot is at most max_late_ms old (it checks at the slot and again after every pause
# of its retry loop, _scheduler.Scheduler._claim), and every publish attempt of one claim() call
# starts within CLAIM_RETRY_S of the call; the last attempt's message is on the wire before its
# request times out (REQUEST_TIMEOUT_S). anarchon's own connection does not buffer publishes
# while it reconnects, so nothing is sent later. So a claim is stored (if at all) at most
# max_late_ms + CLAIM_MARGIN_MS after its slot, by the claiming instance's clock.
CLAIM_MARGIN_MS: Final = int((CLAIM_RETRY_S + REQUEST_TIMEOUT_S) * 1000)
# How often a running backend reads the stream's duplicate window (another instance may have
# grown it, or shrunk it with shrink_window=True).
WINDOW_CHECK_S: Final = 60.0
# Claims whose publish may have been stored unanswered and that the scheduler gave up on are
# settled this often (see NatsBackend._settle); a manual run's claim once the core's 10 s
# deadline for it is surely over; at most MAX_UNSURE are remembered.
SETTLE_EVERY_S: Final = 5.0
MANUAL_SETTLE_AFTER_MS: Final = 60_000
MAX_UNSURE: Final = 100_000
# Server's default duplicate window (a config that says 0 means this).
SERVER_DEFAULT_WINDOW_MS: Final = 120_000


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


@dataclass(frozen=True, slots=True)
class _Unsure:
    """A claim one of whose publishes may have been stored without our hearing of it."""

    request: ClaimRequest
    since_ms: int


def _server_at_least(nc: NATS, major: int, minor: int) -> bool:
    """True if the server this client is connected to is at least ``major.minor``."""
    info: dict[str, Any] = getattr(nc, "_server_info", None) or {}
    try:
        numbers = [int(x) for x in str(info.get("version", "0.0")).split("-")[0].split(".")[:2]]
    except ValueError:
        return False
    return tuple(numbers) >= (major, minor)


def _positive(option: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidOption(f"{option}={value!r} must be an integer >= {minimum}")
    return value


class NatsBackend(Backend):
    """Claims and history in a NATS JetStream stream; one winner per slot by de-duplication.

    :param servers: one URL or a list (``nats://host:4222``, ``tls://...``, credentials as
        ``nats://user:password@host`` or ``nats://token@host``); ignored when ``connection``
        is given.
    :param connection: your own connected nats-py client; you keep ownership (``stop()`` never
        closes it).
    :param stream: the JetStream stream name.
    :param prefix: the subject prefix; a job's subjects are ``<prefix><job>.claims`` and
        ``<prefix><job>.results``.
    :param duplicate_window_ms: the least duplicate window this instance keeps on the stream:
        a new stream gets it, a smaller window is grown to it, a larger one is kept. Every
        job's ``jitter_ms + max_late_ms`` plus the claim retry margin (10 s) must be less than
        the window.
    :param history_size: roughly how many runs are kept per job, at least (the stream's
        per-subject limit).
    :param replicas: replicas of the stream in a NATS cluster; 1 for a new stream when not
        given, and an existing stream keeps its own unless given.
    :param shrink_window: set the stream's window to ``duplicate_window_ms`` even when it is
        larger (windows otherwise only grow). Other running instances whose jobs need more raise
        it again within a minute.
    :param user: user name, with ``password``.
    :param password: password for ``user``; never printed.
    :param token: an authentication token; never printed.
    :param creds: path of a ``.creds`` file (user JWT and nkey seed; needs ``nats-py[nkeys]``).
    :param ca_file: PEM file of the certificate authorities that signed the server's certificate.
    :param cert_file: PEM file of a client certificate (and its key, unless ``key_file``).
    :param key_file: PEM file of the client certificate's key.
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
        user: str | None = None,
        password: str | None = None,
        token: str | None = None,
        creds: str | None = None,
        ca_file: str | None = None,
        cert_file: str | None = None,
        key_file: str | None = None,
    ) -> None:
        _import_nats()
        if isinstance(servers, str):
            servers = [servers]
        if not servers or not all(isinstance(s, str) and s.strip() for s in servers):
            shown = [redact_url(s) if isinstance(s, str) else s for s in servers or []]
            raise InvalidOption(f"servers={shown!r} must be a NATS URL or a non-empty list")
        if connection is not None and not callable(getattr(connection, "jetstream", None)):
            raise InvalidOption(f"connection={connection!r} is not a nats-py client (nats.connect)")
        if not isinstance(shrink_window, bool):
            raise InvalidOption(f"shrink_window={shrink_window!r} must be True or False")
        self.servers: list[str] = [s.strip() for s in servers]
        self._access = Access(
            user=user,
            password=password,
            token=token,
            creds=creds,
            ca_file=ca_file,
            cert_file=cert_file,
            key_file=key_file,
        )
        self._secrets = [*self._access.secrets, *(x for s in self.servers for x in url_secrets(s))]
        self._access.check()
        if connection is not None and self._access.given:
            raise InvalidOption(
                f"{', '.join(self._access.given)} apply only when anarchon opens the connection; "
                "with connection=... configure credentials and TLS on your own client"
            )
        self._connect_options = self._access.connect_options()
        self.stream = subjects.check_stream(stream)
        self.prefix = subjects.check_prefix(prefix)
        self.duplicate_window_ms = _positive("duplicate_window_ms", duplicate_window_ms, 100)
        self.history_size = _positive("history_size", history_size, 1)
        if replicas is not None and (_positive("replicas", replicas, 1) > 5):
            raise InvalidOption(
                f"replicas={replicas!r} must be between 1 and 5 (JetStream's limit)"
            )
        self.replicas = replicas
        self.shrink_window = shrink_window
        self._connection = connection
        self._nc: NATS | None = None
        self._js: JetStreamContext | None = None
        self._in_flight: asyncio.Semaphore | None = None
        self._stream_has_ts: bool | None = None
        self._down = False
        self._connecting = False
        self._connect_error: Exception | None = None
        self._connect_fatal = asyncio.Event()
        # The stream's real duplicate window once known (start()), and what each job added so
        # far needs of it (jitter_ms + max_late_ms + CLAIM_MARGIN_MS).
        self._window_ms: int | None = None
        self._needs: dict[str, int] = {}
        self._guard: asyncio.Future[None] | None = None
        # Claims (by token) whose publish may have been stored without our hearing of it: a
        # duplicate ack for one of them may be our own claim, and one the scheduler gives up on
        # is settled in the background (_settle). max_late_ms of each job, to know when.
        self._unsure: dict[str, _Unsure] = {}
        self._max_late: dict[str, int] = {}
        self._stream_missing_logged = False

    def __repr__(self) -> str:
        where = (
            "connection=<yours>"
            if self._connection is not None
            else repr([redact_url(s) for s in self.servers])
        )
        return f"NatsBackend({where}, stream={self.stream!r}, prefix={self.prefix!r})"

    def _scrub(self, text: str) -> str:
        """``text`` without any password or token this backend was given."""
        return scrub(text, self._secrets)

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

    # -- life cycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Connect (unless given a connection) and create or update the stream. Idempotent.

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
        if self._nc is not None:
            return
        nc = self._connection if self._connection is not None else await self._connect()
        self._nc = nc
        self._js = nc.jetstream(timeout=REQUEST_TIMEOUT_S)
        self._in_flight = asyncio.Semaphore(MAX_IN_FLIGHT)
        try:
            await self._prepare_stream(nc, read_only=read_only)
            if not read_only:
                self._guard = asyncio.ensure_future(self._upkeep())
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        """Close the connection this backend opened; never one you passed in."""
        guard, self._guard = self._guard, None
        if guard is not None:
            guard.cancel()
            await asyncio.gather(guard, return_exceptions=True)
        nc, self._nc, self._js = self._nc, None, None
        if nc is not None and nc is not self._connection and not nc.is_closed:
            await nc.close()

    async def _connect(self) -> NATS:
        nats = _import_nats()
        self._connecting = True
        self._connect_error = None
        self._connect_fatal = asyncio.Event()
        attempt = asyncio.ensure_future(
            nats.connect(
                servers=self.servers,
                name="anarchon",
                connect_timeout=CONNECT_TIMEOUT_S,
                reconnect_time_wait=RECONNECT_WAIT_S,
                max_reconnect_attempts=CONNECT_ATTEMPTS,
                ping_interval=PING_INTERVAL_S,
                max_outstanding_pings=MAX_OUTSTANDING_PINGS,
                # No reconnect buffer: a claim published while disconnected fails at once
                # (retried, fail closed) instead of being sent whenever the connection is back,
                # possibly after its slot left the duplicate window (CLAIM_MARGIN_MS).
                pending_size=-1,
                error_cb=self._on_error,
                disconnected_cb=self._on_disconnected,
                reconnected_cb=self._on_reconnected,
                **self._connect_options,
            )
        )
        fatal = asyncio.ensure_future(self._connect_fatal.wait())
        # nats-py can hang after a TLS verification failure (it never gives up on closing the
        # half-open connection): stop at once on such an error, and bound the whole attempt.
        limit = (CONNECT_TIMEOUT_S + RECONNECT_WAIT_S) * (CONNECT_ATTEMPTS + 1) * len(self.servers)
        try:
            await asyncio.wait({attempt, fatal}, timeout=limit, return_when="FIRST_COMPLETED")
            if not attempt.done():
                attempt.cancel()
                await asyncio.gather(attempt, return_exceptions=True)
                raise TimeoutError(f"no connection within {limit:.0f} s")
            nc: NATS = attempt.result()
        except (OSError, TimeoutError, nats.errors.Error) as exc:
            cause = self._connect_error if self._connect_error is not None else exc
            raise BackendError(
                self._scrub(
                    f"cannot connect to NATS at {servers_shown(self.servers)}: "
                    f"{errors.describe(cause)}. Check that nats-server runs there, with "
                    "JetStream enabled (nats-server -js), and that the URL, credentials and "
                    "TLS files are right"
                )
            ) from None
        finally:
            fatal.cancel()
            self._connecting = False
        # The first connection fails fast; from now on a lost connection is retried forever.
        nc.options["max_reconnect_attempts"] = -1
        return nc

    async def _on_error(self, exc: Exception) -> None:
        # nats-py calls this for every failed (re)connect attempt and for the loss that starts
        # an outage; _on_disconnected says it once per outage, so those stay at debug level.
        import nats.errors

        if self._connecting:
            # Keep the telling cause (refused credentials) over the reset that follows it.
            if self._connect_error is None or not isinstance(exc, OSError):
                self._connect_error = exc
            refused = "authorization violation" in str(exc).lower()
            if refused or isinstance(
                exc, ssl.SSLCertVerificationError | nats.errors.AuthorizationError
            ):
                self._connect_fatal.set()  # retrying cannot help
        lost = isinstance(exc, OSError | nats.errors.StaleConnectionError)
        text = self._scrub(errors.describe(exc))
        if self._connecting or self._down or lost:
            logger.debug("NATS: %s", text, extra={"action": "nats_error"})
        else:
            logger.warning("NATS: %s", text, extra={"action": "nats_error"})

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
            shrink_window=self.shrink_window,
            fence_floor=_server_at_least(nc, 2, 10),
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
        self._window_ms = stream_setup.window_ms(info)

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

    # -- jobs and the duplicate window ------------------------------------------------------

    @staticmethod
    def need_ms(policy: JobPolicy) -> int:
        """How long the stream must remember a slot's claim for this job: ``jitter_ms +
        max_late_ms`` plus :data:`CLAIM_MARGIN_MS` for claim retries past ``max_late_ms``."""
        return policy.jitter_ms + policy.max_late_ms + CLAIM_MARGIN_MS

    @property
    def window_ms(self) -> int:
        """The duplicate window jobs are checked against: the stream's own once started, this
        instance's ``duplicate_window_ms`` (the least it will keep on the stream) before."""
        return self._window_ms if self._window_ms is not None else self.duplicate_window_ms

    def check_job(self, policy: JobPolicy) -> None:
        """Require ``jitter_ms + max_late_ms + CLAIM_MARGIN_MS < `` the duplicate window.

        Before start() the window is this instance's ``duplicate_window_ms``; once started it is
        the stream's real window, which other instances may have grown past it.
        """
        need = self.need_ms(policy)
        window = self.window_ms
        if need >= window:
            raise InvalidOption(
                f"job {policy.name!r}: jitter_ms + max_late_ms + {CLAIM_MARGIN_MS} ms of claim "
                f"retries = {policy.jitter_ms} + {policy.max_late_ms} + {CLAIM_MARGIN_MS} = "
                f"{need} must be less than {self._window_text()}: outside that window "
                "JetStream no longer recognises a repeated claim and a very late instance could "
                f"run the slot again. Lower max_late_ms or jitter_ms, or {self._window_fix(need)}"
            )
        self._needs[policy.name] = need
        self._max_late[policy.name] = policy.max_late_ms

    def _window_text(self) -> str:
        if self._window_ms is None:
            return (
                f"this NATS backend's duplicate_window_ms={self.duplicate_window_ms} (the least "
                f"window it keeps on stream {self.stream!r})"
            )
        return (
            f"the duplicate window of stream {self.stream!r}, {self._window_ms} ms as the stream "
            "has it now (anarchon grows it to the largest duplicate_window_ms of the instances "
            "that started, and never shrinks it)"
        )

    def _window_fix(self, need: int) -> str:
        if self._window_ms is None:
            return f"raise duplicate_window_ms above {need}"
        return f"raise duplicate_window_ms above {need} and restart this instance"

    def skew_budget_ms(self, policy: JobPolicy) -> int | None:
        """The duplicate window less ``jitter_ms + max_late_ms + CLAIM_MARGIN_MS``."""
        return self.window_ms - self.need_ms(policy)

    async def _upkeep(self) -> None:
        """While started: every WINDOW_CHECK_S read the stream's window and raise it again if it
        fell below what this instance keeps (another instance shrank it with
        ``shrink_window=True``); every SETTLE_EVERY_S settle the claims the scheduler gave up
        on whose publish may have been stored."""
        loop = asyncio.get_running_loop()
        next_check = loop.time() + WINDOW_CHECK_S
        while True:
            await asyncio.sleep(max(0.05, min(SETTLE_EVERY_S, next_check - loop.time())))
            try:
                if loop.time() >= next_check:
                    next_check = loop.time() + WINDOW_CHECK_S
                    await self.check_window()
                if self._unsure:
                    await self._settle()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                logger.debug(
                    "NATS upkeep of stream %s failed: %s",
                    self.stream,
                    self._scrub(str(exc) or type(exc).__name__),
                    extra={"action": "upkeep_failed", "stream": self.stream},
                )

    async def check_window(self) -> int | None:
        """Read the stream's duplicate window now (the backend does it every minute) and return
        it (None: the stream is gone).

        If it fell below what this instance keeps, ``duplicate_window_ms`` or, for a job added
        after start() against a longer window, that job's need (another instance shrank it with
        ``shrink_window=True``), raise it back and log a warning naming the job.
        """
        self._require()
        try:
            info = await self._api(subjects.api("STREAM.INFO", self.stream), None)
        except JetStreamError as exc:
            if exc.err_code != errors.STREAM_NOT_FOUND:
                raise
            if not self._stream_missing_logged:
                self._stream_missing_logged = True
                logger.warning(
                    "stream %s no longer exists: claims fail (closed) until it is created "
                    "again, which the next instance to start does",
                    self.stream,
                    extra={"action": "stream_missing", "stream": self.stream},
                )
            return None
        self._stream_missing_logged = False
        window = stream_setup.window_ms(info)
        need, job = max(((n, j) for j, n in self._needs.items()), default=(0, "-"))
        target = max(self.duplicate_window_ms, need + 1)
        if window < target:
            info = await stream_setup.raise_window(self._api, self.stream, target)
            logger.warning(
                "the duplicate window of stream %s was %d ms, less than this instance keeps "
                "(duplicate_window_ms=%d; job %s needs %d ms); raised it to %d ms. Another "
                "instance shrank it (shrink_window=True) or the stream was changed by hand",
                self.stream,
                window,
                self.duplicate_window_ms,
                job,
                need,
                stream_setup.window_ms(info),
                extra={"action": "window_raised", "stream": self.stream, "job": job},
            )
            window = stream_setup.window_ms(info)
        self._window_ms = window
        return window

    # -- claims -----------------------------------------------------------------------------

    async def claim(self, requests: Sequence[ClaimRequest]) -> list[ClaimOutcome]:
        """Publish each request's claim (concurrently) and tell who won; see the module doc."""
        _, _, gate = self._require()
        failed: list[BackendUnavailable] = []
        # Every publish of this call starts within CLAIM_RETRY_S of now (CLAIM_MARGIN_MS),
        # however long a request waits for the in-flight gate.
        deadline = asyncio.get_running_loop().time() + CLAIM_RETRY_S

        async def one(req: ClaimRequest) -> ClaimOutcome:
            async with gate:
                if failed:  # the backend is down: fail the rest of the batch at once
                    raise failed[0]
                try:
                    return await self._claim_one(req, deadline)
                except BackendUnavailable as exc:
                    failed.append(exc)
                    raise

        answers = await asyncio.gather(*(one(r) for r in requests), return_exceptions=True)
        problems = [a for a in answers if isinstance(a, BaseException)]
        if problems:
            permanent = [p for p in problems if not isinstance(p, BackendUnavailable)]
            raise (permanent or problems)[0]
        return [a for a in answers if isinstance(a, ClaimOutcome)]

    async def _claim_one(self, req: ClaimRequest, deadline: float) -> ClaimOutcome:
        now = _now_ms()
        loop = asyncio.get_running_loop()
        if req.slot is not None:
            # Never publish a claim whose id JetStream may have forgotten: it would be stored.
            window = self.window_ms
            margin = SKIP_SAFETY_MS if req.skip_reason is not None else 0
            safe_ms = req.slot + window - min(margin, window // 4)
            if req.skip_reason is not None and now >= safe_ms:
                return self._unrecorded_skip(req, now)
            deadline = min(deadline, loop.time() + (safe_ms - now) / 1000)
        msg_id = subjects.claim_id(req.job, req.slot_key)
        if loop.time() >= deadline:
            # Waited behind earlier claims of a large batch on a slow server: sending now could
            # store the claim later than CLAIM_MARGIN_MS allows. The core retries, if in time.
            raise BackendUnavailable(
                f"NATS: claim {msg_id} not sent: {CLAIM_RETRY_S:.0f} s passed while it waited "
                "for earlier claims of its batch (the server answers slowly)"
            )
        subject = subjects.claims(self.prefix, req.job)
        payload = records.encode_claim(req)
        unsure: list[BaseException] = []  # attempts that may have been stored unanswered

        async def publish(wait_s: float) -> PubAck:
            try:
                return await self._publish(subject, payload, msg_id, wait_s)
            except Exception as exc:
                if errors.maybe_sent(exc):
                    unsure.append(exc)
                raise

        try:
            ack = await self._retry(
                publish, f"claiming {msg_id}", deadline, {"job": req.job, "slot": req.slot}
            )
        except BackendUnavailable:
            if unsure:
                self._remember_unsure(req)
            raise
        if not ack.duplicate:
            # The first message with this id: ours, decided by the ack alone (the seed reads
            # back only on a duplicate). Start time is the local clock's until finish() reads
            # the stored claim's timestamp.
            self._unsure.pop(req.token, None)
            return self._answer(req, records.claim_of_request(req, ack.seq, now), exact=False)
        stored_claim = await self._read_duplicate(req, msg_id, ack.seq, bool(unsure))
        if isinstance(stored_claim, ClaimOutcome):
            return stored_claim
        logger.debug(
            "claim %s is a duplicate of seq %d (%s)",
            msg_id,
            ack.seq,
            "ours: a retried publish" if stored_claim.token == req.token else "another's",
            extra={"job": req.job, "slot": req.slot, "action": "claim_duplicate"},
        )
        return self._answer(req, stored_claim, exact=True)

    async def _read_duplicate(
        self, req: ClaimRequest, msg_id: str, seq: int, unsure: bool
    ) -> Claim | ClaimOutcome:
        """The stored claim a duplicate ack points at, or the outcome when it cannot be read.

        * gone (trimmed by the per-subject limit): lost, nobody to ask;
        * unreadable, and none of our publishes with this token can have been stored (this is
          the first answer we got): lost to another instance, logged;
        * unreadable, and it may be ours (an earlier publish of this token went unanswered):
          BackendUnavailable, so the core retries the claim with the same token and a later
          read settles it.
        """
        maybe_ours = unsure or req.token in self._unsure
        try:
            stored = await self._get_retrying({"seq": seq}, f"reading claim {msg_id}")
        except BackendUnavailable as exc:
            if maybe_ours:
                self._remember_unsure(req)
                raise
            logger.warning(
                "claim %s lost: the slot's claim (seq %d) is another instance's, and reading it "
                "failed (%s)",
                msg_id,
                seq,
                exc,
                extra={"job": req.job, "slot": req.slot, "action": "claim_unread"},
            )
            return self._lost_unread(req, seq, str(exc))
        self._unsure.pop(req.token, None)
        if stored is None:
            return self._gone(req, seq)
        decoded = records.decode_claim(stored)
        if decoded is None:
            raise BackendError(
                f"NATS: message {stored.seq} on {stored.subject} has the claim id {msg_id} "
                "but is not an anarchon claim; is something else publishing under prefix "
                f"{self.prefix!r}?"
            )
        return decoded

    def _remember_unsure(self, req: ClaimRequest) -> None:
        if req.token in self._unsure:
            return
        if len(self._unsure) >= MAX_UNSURE:
            oldest = next(iter(self._unsure))
            dropped = self._unsure.pop(oldest).request
            logger.warning(
                "more than %d unconfirmed claims; %s:%s will not be settled (if stored, history "
                "shows it running)",
                MAX_UNSURE,
                dropped.job,
                dropped.slot_key,
                extra={"job": dropped.job, "slot": dropped.slot, "action": "settle_dropped"},
            )
        self._unsure[req.token] = _Unsure(req, _now_ms())

    def _settle_due(self, entry: _Unsure, now: int) -> bool:
        """True once the scheduler has surely stopped retrying the claim: its slot is later than
        max_late_ms + CLAIM_MARGIN_MS (a manual run: a minute after the first failure)."""
        req = entry.request
        if req.slot is None:
            return now >= entry.since_ms + MANUAL_SETTLE_AFTER_MS
        late = self._max_late.get(req.job, self.window_ms // 2)
        return now > req.slot + late + CLAIM_MARGIN_MS

    async def _settle(self) -> None:
        """Settle each claim the scheduler gave up on whose publish may have been stored
        unanswered, so that history never shows it ``running`` with no runner:

        * stored, ours: a result closes it, ``skipped`` with the reason below;
        * not stored: a skip record with that reason is stored under the slot's id (the same
          record a too-late instance leaves), unless the slot is too close to the end of the
          duplicate window for that to be safe;
        * another instance's claim, or a skip record: nothing to do.
        """
        now = _now_ms()
        for token, entry in list(self._unsure.items()):
            if not self._settle_due(entry, now):
                continue
            try:
                await self._settle_one(entry)
            except BackendUnavailable:
                continue  # next round; _settle_one gives up once the slot leaves the window
            except BackendError as exc:
                logger.warning(
                    "cannot settle claim %s:%s: %s",
                    entry.request.job,
                    entry.request.slot_key,
                    exc,
                    extra={"job": entry.request.job, "action": "settle_failed"},
                )
            self._unsure.pop(token, None)

    async def _settle_one(self, entry: _Unsure) -> None:
        req = entry.request
        msg_id = subjects.claim_id(req.job, req.slot_key)
        reason = (
            f"not run: {req.instance} could not confirm its claim while NATS was unavailable, "
            "until the slot was too late"
        )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CLAIM_RETRY_S
        now = _now_ms()
        if req.slot is not None:
            window = self.window_ms
            safe_ms = req.slot + window - min(SKIP_SAFETY_MS, window // 4)
            if now >= safe_ms:
                logger.info(
                    "claim %s not settled: the slot is too close to the end of the duplicate "
                    "window to look it up by its id; if it was stored, history shows it running",
                    msg_id,
                    extra={"job": req.job, "slot": req.slot, "action": "settle_too_late"},
                )
                return
            deadline = min(deadline, loop.time() + (safe_ms - now) / 1000)
        record = replace(req, token=uuid.uuid4().hex, skip_reason=reason)
        subject = subjects.claims(self.prefix, req.job)
        payload = records.encode_claim(record)
        ack = await self._retry(
            lambda t: self._publish(subject, payload, msg_id, t), f"settling {msg_id}", deadline
        )
        if not ack.duplicate:
            logger.info(
                "claim %s settled: it was never stored; the slot is recorded skipped (%s)",
                msg_id,
                reason,
                extra={"job": req.job, "slot": req.slot, "action": "claim_settled"},
            )
            return
        stored = await self._get_retrying({"seq": ack.seq}, f"reading claim {msg_id}")
        claim = records.decode_claim(stored) if stored is not None else None
        if claim is None or claim.skipped or claim.token != req.token:
            return  # another instance's claim or a skip record, or trimmed: nothing to close
        await self._finish(claim.ticket(), RunStatus.SKIPPED, None, reason)
        logger.info(
            "claim %s settled: it was stored but never confirmed, so nobody ran it; closed as "
            "skipped (%s)",
            msg_id,
            reason,
            extra={"job": req.job, "slot": req.slot, "action": "claim_settled"},
        )

    @staticmethod
    def _answer(req: ClaimRequest, claim: Claim, *, exact: bool) -> ClaimOutcome:
        run = claim.run()
        if claim.skipped:
            return ClaimOutcome(status=ClaimStatus.SKIPPED, run=run)
        if claim.token == req.token:
            ticket = claim.ticket()
            now = claim.time_ms if exact else None
            return ClaimOutcome(status=ClaimStatus.WON, run=run, ticket=ticket, backend_now_ms=now)
        return ClaimOutcome(status=ClaimStatus.LOST, run=run)

    def _gone(self, req: ClaimRequest, seq: int) -> ClaimOutcome:
        """A duplicate of a claim the per-subject limit already removed: lost, nobody to ask."""
        return self._lost_without_record(
            req,
            f"lost: the winning claim (seq {seq}) was already trimmed from stream "
            f"{self.stream!r} (history_size={self.history_size})",
        )

    def _lost_unread(self, req: ClaimRequest, seq: int, why: str) -> ClaimOutcome:
        return self._lost_without_record(
            req,
            f"lost: the slot's claim (seq {seq}) is another instance's; reading it failed: {why}",
        )

    @staticmethod
    def _lost_without_record(req: ClaimRequest, reason: str) -> ClaimOutcome:
        started = ms_to_datetime(_now_ms())
        assert started is not None
        gone = Run(
            job=req.job,
            slot=ms_to_datetime(req.slot),
            run_id=req.run_id,
            instance=req.instance,
            trigger=req.trigger,
            attempt=1,
            status=RunStatus.SKIPPED,
            started_at=started,
            finished_at=started,
            reason=reason,
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
                f"duplicate window ({self.window_ms} ms), where a "
                "record could no longer be told apart from the slot's claim"
            ),
        )
        return ClaimOutcome(status=ClaimStatus.SKIPPED, run=run)

    # -- results ----------------------------------------------------------------------------

    async def finish(self, ticket: Ticket, status: str, error: str | None) -> Run:
        """Publish the run's result to ``<prefix><job>.results`` (once, by message id).

        The result and the claim are then read back together (one round trip), so the run
        returned starts and ends at the stream's timestamps, as history shows it.
        """
        return await self._finish(ticket, status, error, None)

    async def _finish(
        self, ticket: Ticket, status: str, error: str | None, reason: str | None
    ) -> Run:
        self._require()
        outcome = RunStatus(status)
        msg_id = subjects.result_id(ticket.job, ticket.slot_key)
        subject = subjects.results(self.prefix, ticket.job)
        payload = records.encode_result(ticket, outcome, error, reason)
        deadline = asyncio.get_running_loop().time() + CLAIM_RETRY_S
        ack = await self._retry(
            lambda t: self._publish(subject, payload, msg_id, t), f"recording {msg_id}", deadline
        )
        stored, claimed = await asyncio.gather(
            self._get_retrying({"seq": ack.seq}, f"reading result {msg_id}"),
            self._claim_time(ticket),
        )
        result = records.decode_result(stored) if stored is not None else None
        if ack.duplicate and result is not None and result.run.run_id != ticket.run_id:
            raise LeaseLost(
                f"run {ticket.run_id} of job {ticket.job!r}: slot {ticket.slot_key} already has "
                f"a result from run {result.run.run_id}; this one is refused"
            )
        started = ms_to_datetime(claimed if claimed is not None else ticket.started_at_ms)
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
            reason=reason,
        )

    async def _claim_time(self, ticket: Ticket) -> int | None:
        """The stream timestamp of the ticket's claim (None if it was trimmed)."""
        if ticket.fence is None:
            return None
        stored = await self._get_retrying(
            {"seq": ticket.fence}, f"reading claim {ticket.job}:{ticket.slot_key}"
        )
        if stored is None or stored.subject != subjects.claims(self.prefix, ticket.job):
            return None
        return stored.time_ms

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
