"""The NATS backend's steering store: pauses and run requests in a JetStream key-value bucket.

The bucket is ``<stream>_control`` (``anarchon_control_<hash of the stream name>`` when the
stream's name has characters a bucket name cannot), one revision per key, created on the first
write, again by a running instance that used it if it is lost (:mod:`._guard`), and never by a
read. Keys start with the base64url form of the backend's prefix, so
backends that share a stream under different prefixes keep apart:

* ``<prefix>.p.<job>`` (the job's name base64url-encoded; ``*`` for the whole cluster): the
  job's :class:`~anarchon.control.Pause` as JSON;
* ``<prefix>.r.<request id>`` (base64url-encoded): a :class:`~anarchon.control.RunRequest`.

What is atomic here and what is not:

* storing a pause is one ``put``; storing a request is one ``create``, which the server refuses
  when the key exists, so a request is stored once per id;
* resuming reads the pause and deletes it with a compare-and-set on the revision read, so the
  pause returned is the one removed (a pause replaced in between is read again);
* removing a request purges its key's subject: one step, and it leaves no tombstone behind;
* listing requests lists the keys, then reads each (each not read before: a stored request
  never changes): a snapshot, not one step;
* **the claim's pause check is not atomic with the claim.** JetStream's de-duplication decides the
  claim, and it cannot read the bucket. Before it publishes a claim, an instance lists the bucket's
  pause keys (from the bucket's stream info: one request for any number of jobs) and reads the job's
  and ``*``'s pauses among them (the list and each pause remembered for at most
  :data:`._timings.PAUSE_CACHE_S`; a write through this backend object updates them at once, and a
  write anywhere else as soon as the watch on the bucket's pause subjects hears it, while that watch
  lets claims go on without waiting for the list to be read again: see ``_pause_keys``) and, if one
  holds on its own clock, publishes a skip record instead. A pause stored while another instance's
  claim is already past that check (or within that instance's cache time) does not stop that claim:
  a pause takes effect within about a second, not at an instant.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Collection, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, Final, Protocol, TypeVar

from anarchon.control import ALL_JOBS, Pause, RunRequest, active_pause
from anarchon.errors import BackendError, BackendUnavailable
from anarchon.kit import Action, Trigger, log_fields

from . import _timings as timings
from ._buckets import until_answered
from ._connection import bounded, cancel_unfinished
from ._registry import bucket_name, token
from ._wire import subscribe_sink

if TYPE_CHECKING:
    from nats.aio.client import Client as NATS
    from nats.js.client import JetStreamContext
    from nats.js.kv import KeyValue

    from ._backend import NatsBackend

__all__ = ["NatsControl"]

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)
#: A compare-and-set resume is tried this many times while others replace the pause.
RESUME_TRIES: Final = 5
#: At most this many pause reads are in flight at once (a batch of claims of many jobs).
READS_AT_ONCE: Final = 64

logger = logging.getLogger("anarchon.backends.nats")


class NatsControl:
    """A :class:`~anarchon.control.ControlStore` in a JetStream key-value bucket; the backend's
    claims read its pauses through :meth:`active`. One per backend (its cache is shared)."""

    def __init__(self, backend: NatsBackend) -> None:
        self._backend = backend
        self.bucket = bucket_name(backend.stream, "control")
        self._space = token(backend.prefix)
        self._kv: KeyValue | None = None
        self._js: JetStreamContext | None = None
        self._opening: tuple[asyncio.AbstractEventLoop, asyncio.Lock] | None = None
        # Each pause key's pause (None: none) and until when (loop time) it is trusted.
        self._cache: dict[str, tuple[float, Pause | None]] = {}
        # Until when (loop time) the listed pause keys are trusted, and the keys.
        self._listed: tuple[float, set[str]] | None = None
        # The watch on the bucket's pause subjects (see _pause_keys): the client it is on and
        # its subscription; the client's reconnect count when the listing it keeps was read;
        # every key it has heard (a listing may be read before the bucket's stream stored
        # what the watch heard: each listing keeps these); how many changes it has heard (a
        # read begun before a change must not replace what the change said); the listing read
        # in the background.
        self._watch: tuple[NATS, Any] | None = None
        self._watch_refused = False
        self._listed_reconnects = -1
        self._heard_keys: set[str] = set()
        self._changes = 0
        self._listing: asyncio.Future[set[str]] | None = None
        self._loading: dict[str, asyncio.Future[Pause | None]] = {}
        self._reads: tuple[asyncio.AbstractEventLoop, asyncio.Semaphore] | None = None
        # The requests read, by key, while their keys stay listed (see requests()).
        self._requests_read: dict[str, RunRequest] = {}
        self._quiet_until = 0.0

    # -- keys and the bucket ----------------------------------------------------------------

    def _pause_key(self, job: str) -> str:
        return f"{self._space}.p.{token(job)}"

    def _request_key(self, request_id: str) -> str:
        return f"{self._space}.r.{token(request_id)}"

    async def _bounded(self, aw: Awaitable[T], doing: str) -> T:
        """``aw`` within CALL_TIMEOUT_S, its failure translated (:func:`._connection.bounded`).
        After a failure the bucket is looked up again on the next call (it may have been
        deleted, or re-created)."""
        try:
            return await bounded(aw, doing, timings.CALL_TIMEOUT_S)
        except BackendError as exc:
            self._kv = None
            self._backend._conn.note_failure(exc)  # the bucket may be gone: the guard looks
            raise

    async def _open(self, create: bool) -> KeyValue | None:
        """The bucket; None while it does not exist (``create``: make it). A bucket found is
        remembered; one found missing is looked up again at the next call, never believed
        missing: another instance's first write creates it at any moment, and a resume, a
        listing or a poll answered from such a belief would miss that write (a resume would
        answer 'not paused' and leave the pause in force)."""
        _, js = self._backend._conn.require()
        if self._kv is not None and self._js is js:
            return self._kv
        loop = asyncio.get_running_loop()
        if self._opening is None or self._opening[0] is not loop:
            self._opening = (loop, asyncio.Lock())
        async with self._opening[1]:
            if self._kv is not None and self._js is js:
                return self._kv
            kv = await self._backend._buckets.open_bucket(
                self.bucket,
                create=create,
                doing="opening the control bucket",
                bounded=self._bounded,
            )
            if kv is None:
                return None
            self._kv, self._js = kv, js
            return kv

    def _remember(self, job: str, pause: Pause | None) -> None:
        self._cache[self._pause_key(job)] = (
            asyncio.get_running_loop().time() + timings.PAUSE_CACHE_S,
            pause,
        )

    # -- pauses -----------------------------------------------------------------------------

    async def pause(self, pause: Pause) -> None:
        """See :meth:`anarchon.control.ControlStore.pause`."""
        kv = await self._open(create=True)
        assert kv is not None
        key = self._pause_key(pause.job)
        value = pause.to_json().encode()
        await self._bounded(
            until_answered(lambda: kv.put(key, value), "storing a pause", timings.BUCKET_RETRY_S),
            "storing a pause",
        )
        self._remember(pause.job, pause)
        if self._listed is not None:
            self._listed[1].add(key)

    async def _read_pause(self, kv: KeyValue, job: str) -> tuple[Pause | None, int]:
        from nats.js.errors import NotFoundError

        key = self._pause_key(job)

        async def read() -> tuple[Pause | None, int]:
            try:
                entry = await kv.get(key)
            except NotFoundError:
                return None, 0
            if not entry.value:
                return None, 0
            return _decode(Pause, entry.value, key), entry.revision or 0

        return await self._bounded(read(), f"reading the pause of {job!r}")

    async def resume(self, job: str) -> Pause | None:
        """See :meth:`anarchon.control.ControlStore.resume`: read, then delete by revision."""
        kv = await self._open(create=False)
        if kv is None:
            return None
        for _ in range(RESUME_TRIES):
            pause, revision = await self._read_pause(kv, job)
            if pause is None:
                self._remember(job, None)
                return None
            deleted = await self._bounded(
                self._backend._buckets.delete_key(self.bucket, self._pause_key(job), revision),
                f"resuming {job!r}",
            )
            if deleted is None:
                continue  # replaced since it was read: read it again
            self._remember(job, None)
            return pause
        raise BackendUnavailable(
            f"NATS: resuming {job!r} failed: its pause was replaced {RESUME_TRIES} times while "
            "it was being removed; try again"
        )

    async def pauses(self) -> list[Pause]:
        """See :meth:`anarchon.control.ControlStore.pauses`."""
        kv = await self._open(create=False)
        if kv is None:
            return []
        found = []
        for key in await self._keys(kv, "p"):
            entry = await self._get(kv, key, "reading the pauses")
            if entry is not None:
                found.append(_decode(Pause, entry, key))
        return found

    async def holding(self, jobs: Collection[str], now_ms: int) -> dict[str, Pause]:
        """The pause that holds each of ``jobs`` at ``now_ms`` (this instance's clock), for the
        jobs one holds: the job's own, else the whole cluster's. Each is read from the bucket at
        most every :data:`._timings.PAUSE_CACHE_S`. Only the pauses the bucket lists (its stream
        info: one request for any number of jobs, at most every :data:`._timings.PAUSE_CACHE_S`) are
        read. A permanent failure to read (a user not allowed to read the bucket) is logged and
        answers no pause; a transient one raises BackendUnavailable."""
        try:
            listed = await self._pause_keys()
            if not listed:  # no pause stored: nothing to look up (every claim asks)
                return {}
            names = [n for n in (*jobs, ALL_JOBS) if self._pause_key(n) in listed]
            found = await self._read_cached(names) if names else {}
        except BackendUnavailable:
            raise
        except BackendError as exc:
            self._warn_unreadable(exc)
            return {}
        if not any(found.values()):
            return {}
        held = {}
        every = found.get(ALL_JOBS)
        for job in jobs:
            pause = active_pause(
                [p for p in (found.get(job), every) if p is not None],
                job,
                Trigger.SCHEDULE,
                now_ms,
            )
            if pause is not None:
                held[job] = pause
        return held

    def nothing_paused(self) -> bool:
        """True while the listed pause keys are trusted (:meth:`_pause_keys`) and there are
        none: :meth:`holding` would answer no pause without a read (the claim's fast path)."""
        listed = self._listed
        if listed is None or listed[1]:
            return False
        if asyncio.get_running_loop().time() < listed[0]:
            return True
        if self._watching():
            self._list_soon()
            return True
        return False

    async def _pause_keys(self) -> set[str]:
        """The keys of the pauses stored in the bucket (a resumed pause's key stays listed, its
        delete marker read as no pause); none while the bucket does not exist.

        The listing is kept current by a watch: a subscription to the bucket's pause subjects
        (``$KV.<bucket>.<prefix>.p.>``), which hears every pause stored or removed, by any instance,
        as it is stored. While the watch runs on the connection the listing was read on (no
        reconnect since), a claim does not wait for a listing: one older than
        :data:`._timings.PAUSE_CACHE_S` is read again in the background. Without the watch (before
        the first claim, after a reconnect, or where the server refuses the subscription) the claim
        reads the listing first, at most every :data:`._timings.PAUSE_CACHE_S`, as it always did.
        """
        loop = asyncio.get_running_loop()
        listed = self._listed
        if listed is not None:
            if loop.time() < listed[0]:
                return listed[1]
            if self._watching():
                self._list_soon()
                return listed[1]
        await self._start_watch()
        return await self._list()

    def _watching(self) -> bool:
        """True while the watch keeps the listing current: it runs on the backend's client and
        the client has not reconnected since the listing was read."""
        watch = self._watch
        nc = self._backend._conn.nc
        return (
            watch is not None
            and watch[0] is nc
            and nc is not None
            and nc.is_connected
            and nc.stats["reconnects"] == self._listed_reconnects
        )

    async def _start_watch(self) -> None:
        """Subscribe to the bucket's pause subjects on the backend's client, unless the watch
        runs there or the server refused it. Best effort: without it claims read the listing."""
        nc = self._backend._conn.nc
        if nc is None or self._watch_refused:
            return
        if self._watch is not None and self._watch[0] is nc:
            return
        await self._stop_watch()
        before = nc.last_error
        sub = None
        try:
            sub = await subscribe_sink(
                nc, f"$KV.{self.bucket}.{self._space}.p.>", self._heard_pause
            )
            # The server answers a subscription it refuses before this flush's answer.
            await nc.flush(timeout=round(timings.CALL_TIMEOUT_S))
            refused = nc.last_error
            if refused is not before and "permissions violation" in str(refused).lower():
                self._watch_refused = True
                raise BackendError(str(refused))
        except Exception as exc:
            logger.debug("NATS: no watch on the pauses of %s: %s", self.bucket, exc)
            if sub is not None:
                with contextlib.suppress(Exception):
                    await sub.unsubscribe()
            return
        self._watch = (nc, sub)

    def _heard_pause(self, msg: Any) -> None:
        """A pause stored or removed (in nats-py's read loop): its key is listed from now on,
        and what the message says is the key's pause for :data:`._timings.PAUSE_CACHE_S` (the server
        may hand the message to the watch before the bucket's stream has stored it: a read
        of the key or a listing at that moment still answers the state before). A read begun
        before the message does not replace it (see :meth:`_load`)."""
        key = msg.subject[len(self.bucket) + 5 :]  # "$KV.<bucket>.<key>"
        self._changes += 1
        self._heard_keys.add(key)
        if self._listed is not None:
            self._listed[1].add(key)
        self._loading.pop(key, None)  # claims from now on do not wait for an older read
        try:
            pause = _heard_value(msg, key)
        except BackendError as exc:
            logger.debug("%s", exc)
            self._cache.pop(key, None)  # read it from the bucket (which names the problem)
            return
        self._cache[key] = (asyncio.get_running_loop().time() + timings.PAUSE_CACHE_S, pause)

    def _list_soon(self) -> None:
        """Read the listing again in the background (one read at a time)."""
        if self._listing is None or self._listing.done():
            self._listing = asyncio.ensure_future(self._list_quietly())

    async def _list_quietly(self) -> set[str]:
        try:
            return await self._list()
        except BackendUnavailable as exc:
            logger.debug("NATS: listing the pauses of %s failed: %s", self.bucket, exc)
        except BackendError as exc:
            self._warn_unreadable(exc)
        return set()

    async def _list(self) -> set[str]:
        """Read the bucket's pause keys (one request), with the keys the watch hears meanwhile;
        they are trusted for :data:`._timings.PAUSE_CACHE_S`, and longer while the watch runs."""
        loop = asyncio.get_running_loop()
        nc = self._backend._conn.nc
        reconnects = nc.stats["reconnects"] if nc is not None else -1
        # Looked up on the server (see _open): the watch may have started after a lookup (of a
        # run request poll, say) found no bucket, and the first pause stored since, unheard.
        kv = await self._open(create=False)
        keys = set() if kv is None else set(await self._keys(kv, "p"))
        keys |= self._heard_keys  # heard during the read, or before the stream stored them
        self._listed = (loop.time() + timings.PAUSE_CACHE_S, keys)
        self._listed_reconnects = reconnects
        return keys

    async def _stop_watch(self) -> None:
        watch, self._watch = self._watch, None
        if watch is not None:
            with contextlib.suppress(Exception):  # the connection is closed already
                await watch[1].unsubscribe()

    async def close(self) -> None:
        """Stop the watch and any listing under way (the backend stops)."""
        listing, self._listing = self._listing, None
        await cancel_unfinished(listing)
        await self._stop_watch()
        self._listed = None
        self._heard_keys.clear()

    def _warn_unreadable(self, exc: BackendError) -> None:
        loop = asyncio.get_running_loop()
        if loop.time() < self._quiet_until:
            return
        self._quiet_until = loop.time() + timings.UNREADABLE_WARN_S
        logger.warning(
            "pauses not checked: cannot read key-value bucket %s (%s); claims go on as if "
            "nothing were paused",
            self.bucket,
            exc,
            extra=log_fields(Action.NATS_ERROR),
        )

    async def _read_cached(self, names: Sequence[str]) -> dict[str, Pause | None]:
        loop = asyncio.get_running_loop()
        now = loop.time()
        found: dict[str, Pause | None] = {}
        missing = []
        for name in names:
            known = self._cache.get(self._pause_key(name))
            if known is not None and now < known[0]:
                found[name] = known[1]
            else:
                missing.append(name)
        if not missing:
            return found
        if self._reads is None or self._reads[0] is not loop:
            self._reads = (loop, asyncio.Semaphore(READS_AT_ONCE))
        gate = self._reads[1]

        async def load(name: str) -> Pause | None:
            async with gate:
                return await self._load(name)

        def one(name: str) -> asyncio.Future[Pause | None]:
            key = self._pause_key(name)
            loading = self._loading.get(key)
            if loading is None:
                loading = asyncio.ensure_future(load(name))
                self._loading[key] = loading
                loading.add_done_callback(partial(self._loaded, key))
            return asyncio.shield(loading)

        answers = await asyncio.gather(*(one(name) for name in missing))
        found.update(zip(missing, answers, strict=True))
        return found

    def _loaded(self, key: str, loading: asyncio.Future[Pause | None]) -> None:
        if self._loading.get(key) is loading:
            del self._loading[key]

    async def _load(self, job: str) -> Pause | None:
        """The job's pause, read from the bucket and remembered, unless the watch heard of a
        change while it was read: then what the watch heard is the newer answer."""
        changes = self._changes
        kv = await self._open(create=False)
        pause = None if kv is None else (await self._read_pause(kv, job))[0]
        if self._changes != changes:
            heard = self._cache.get(self._pause_key(job))
            if heard is not None:
                return heard[1]
            return pause
        self._remember(job, pause)
        return pause

    # -- run requests -----------------------------------------------------------------------

    async def request(self, request: RunRequest) -> bool:
        """See :meth:`anarchon.control.ControlStore.request`: a ``create``, refused if the key
        exists."""
        kv = await self._open(create=True)
        assert kv is not None
        key, value = self._request_key(request.id), request.to_json().encode()
        doing = f"storing run request {request.id}"
        return await self._bounded(
            _unless_changed(
                until_answered(lambda: kv.create(key, value), doing, timings.BUCKET_RETRY_S)
            ),
            doing,
        )

    async def requests(self, jobs: Sequence[str] | None = None) -> list[RunRequest]:
        """See :meth:`anarchon.control.ControlStore.requests`: lists the keys, reads each one
        not read before. A request never changes once stored (a ``create`` stores it, a purge
        removes it; its id, random or its retry's own, is stored once), so the requests read
        are kept while their keys stay listed: the request poller's listing every second reads
        only the new ones, not every pending retry again (one request each)."""
        kv = await self._open(create=False)
        if kv is None:
            return []
        wanted = None if jobs is None else set(jobs)
        if wanted is not None and not wanted:
            return []
        read_before, listed = self._requests_read, {}
        for key in await self._keys(kv, "r"):
            request = read_before.get(key)
            if request is None:
                entry = await self._get(kv, key, "reading run requests")
                if entry is None:
                    continue
                request = _decode(RunRequest, entry, key)
            listed[key] = request
        self._requests_read = listed
        found = [r for r in listed.values() if wanted is None or r.job in wanted]
        return sorted(found, key=lambda r: (r.due_ms, r.requested_at_ms, r.id))

    async def done(self, request_id: str) -> None:
        """See :meth:`anarchon.control.ControlStore.done`: purges the key's subject (no
        tombstone is left)."""
        kv = await self._open(create=False)
        if kv is None:
            return
        await self._bounded(
            self._backend._buckets.purge_keys(self.bucket, self._request_key(request_id)),
            f"removing run request {request_id}",
        )

    # -- reading ----------------------------------------------------------------------------

    async def _keys(self, kv: KeyValue, kind: str) -> list[str]:
        start = f"{self._space}.{kind}."
        return await self._bounded(
            self._backend._buckets.bucket_keys(self.bucket, start), "listing the control bucket"
        )

    async def _get(self, kv: KeyValue, key: str, doing: str) -> bytes | None:
        from nats.js.errors import NotFoundError

        async def read() -> bytes | None:
            try:
                entry = await kv.get(key)
            except NotFoundError:
                return None  # removed since it was listed
            return entry.value or None

        return await self._bounded(read(), doing)


class _Document(Protocol[T_co]):
    def from_json(self, text: bytes) -> T_co: ...


def _decode(kind: _Document[T], data: bytes, key: str) -> T:
    """Read a stored document; BackendError naming the key if it is not one of anarchon's."""
    try:
        return kind.from_json(data)
    except (KeyError, TypeError, ValueError) as exc:
        raise BackendError(
            f"NATS: key {key!r} of the control bucket holds {data[:80]!r}, not an anarchon "
            f"document ({type(exc).__name__}: {exc}); is something else writing to it?"
        ) from exc


def _heard_value(msg: Any, key: str) -> Pause | None:
    """The pause a message on a pause subject stores: None for a delete or purge marker."""
    operation = (msg.headers or {}).get("KV-Operation")
    if operation in ("DEL", "PURGE") or not msg.data:
        return None
    return _decode(Pause, msg.data, key)


async def _unless_changed(write: Awaitable[object]) -> bool:
    """True once ``write`` (a ``create``) is done; False if the server refused it because the
    key exists. Caught here: nats-py's error for it has no ``err_code`` for the generic
    translation."""
    from nats.js.errors import KeyWrongLastSequenceError

    try:
        await write
    except KeyWrongLastSequenceError:
        return False
    return True
