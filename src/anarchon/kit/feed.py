"""One change feed for every lease backend: the listeners of :meth:`LeaseBackend.subscribe
<anarchon.backend.LeaseBackend.subscribe>`, a dispatch that isolates a failing listener, and a
supervised loop that polls (or reconnects to) the backend's stream of changes.

A backend supplies only its stream: a coroutine that waits for the next changes and returns them
as :class:`~anarchon.backend.ChangeEvent` objects (or raises while the backend is out of reach),
and the errors that mean "out of reach". A stream on a connection (pub/sub, LISTEN) connects in
the first call after a failure and returns no events once subscribed, so the feed knows it is
live. The loop logs once per outage, on the logger ``anarchon.backends.<name>``, with the actions
``notifications_lost`` and ``notifications_resumed``: losing notifications is harmless (backups
still check at lease expiry), but an operator should see it.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
from collections.abc import Awaitable, Callable, Iterator, Sequence
from json.encoder import encode_basestring_ascii as _quote

from .._frozen import maker
from .._members import WON as _WON
from ..backend import (
    ChangeEvent,
    ChangeListener,
    ClaimListener,
    ClaimNotice,
    ClaimOutcome,
)
from ..logs import Action, log_fields
from .calls import consume

__all__ = ["ChangeFeed", "NextChanges", "decode_notices", "encode_notice", "won_notices"]

_new_notice = maker(ClaimNotice)  # one per won claim (see anarchon._frozen)

NextChanges = Callable[[], Awaitable[Sequence[ChangeEvent | ClaimNotice]]]
"""A backend's stream of changes: wait for the next ones and return them (none is fine: a
subscription made, a quiet connection checked); raise while the backend is out of reach. Claim
notices (:meth:`~anarchon.backend.Backend.subscribe_claims`) may come on the same stream."""


def won_notices(outcomes: Sequence[ClaimOutcome]) -> list[ClaimNotice]:
    """A notice for each won claim among ``outcomes`` (for a backend that announces claims
    after it answered them, as the in-memory and NATS backends do)."""
    return [
        _new_notice(t.job, t.slot_key, t.instance, t.lease_expires_at_ms)
        for o in outcomes
        if o.status is _WON and (t := o.ticket) is not None
    ]


def encode_notice(notice: ClaimNotice) -> str:
    """One notice as compact JSON (``[job, slot_key, instance, lease_expires_at_ms]``), the
    shape :func:`decode_notices` reads; backends that build it in SQL or Lua write the same."""
    # Written out (the same text as json.dumps with compact separators): a broker sends one
    # after every won claim.
    expires = notice.lease_expires_at_ms
    return (
        f"[{_quote(notice.job)},{_quote(notice.slot_key)},{_quote(notice.instance)},"
        f"{'null' if expires is None else f'{expires:d}'}]"
    )


def decode_notices(data: str | bytes, logger: logging.Logger) -> list[ClaimNotice]:
    """The notices in ``data``: one notice (:func:`encode_notice`) or a JSON list of them. What
    cannot be read is logged (``claim_notice_malformed``) and dropped: a lost notice costs one
    losing claim, never a run."""
    try:
        value = json.loads(data)
        items = value if value and isinstance(value[0], list) else [value]
        notices = []
        for item in items:
            job, slot_key, instance, expires = item
            if not all(isinstance(v, str) for v in (job, slot_key, instance)) or not (
                expires is None or (isinstance(expires, int) and not isinstance(expires, bool))
            ):
                raise TypeError(f"bad field types in {item!r}")
            notices.append(ClaimNotice(job, slot_key, instance, expires))
    except (ValueError, TypeError, IndexError, KeyError) as exc:
        logger.warning(
            "dropping a malformed claim notice %.200r: %s",
            data,
            exc,
            extra=log_fields(Action.CLAIM_NOTICE_MALFORMED),
        )
        return []
    return notices


# How long stop() waits for each cancellation before cancelling again.
_CANCEL_WAIT_S = 0.5


class ChangeFeed:
    """The listeners of one backend and the task that feeds them.

    :param backend: the backend's short name, for the logger ``anarchon.backends.<backend>``.
    """

    def __init__(self, backend: str) -> None:
        self.logger = logging.getLogger(f"anarchon.backends.{backend}")
        self._listeners: list[ChangeListener] = []
        self._claims: list[ClaimListener] = []
        self._task: asyncio.Task[None] | None = None
        self._lost = False
        self._live = asyncio.Event()

    @property
    def listeners(self) -> Sequence[ChangeListener]:
        """The listeners, in the order they subscribed."""
        return tuple(self._listeners)

    @property
    def running(self) -> bool:
        """True while the supervised loop runs (see :meth:`start`)."""
        return self._task is not None

    @property
    def live(self) -> bool:
        """True while the stream answers: since its last call returned, until one raises."""
        return self._live.is_set()

    @property
    def claim_listeners(self) -> Sequence[ClaimListener]:
        """The claim listeners (:meth:`add_claims`), in the order they subscribed."""
        return tuple(self._claims)

    def add_claims(self, listener: ClaimListener) -> None:
        """Subscribe ``listener`` to claim notices: called with each batch of them."""
        self._claims.append(listener)

    def dispatch_claims(self, notices: Sequence[ClaimNotice]) -> None:
        """Call every claim listener with ``notices`` (nothing for none). A listener that
        raises is logged and the others are still called."""
        if not notices:
            return
        for listener in tuple(self._claims):
            try:
                listener(notices)
            except Exception:
                self.logger.exception(
                    "a claim listener failed on %d notice(s); the others were still told",
                    len(notices),
                    extra=log_fields(Action.LISTENER_FAILED, notices[0].job),
                )

    def add(self, listener: ChangeListener) -> None:
        """Subscribe ``listener``: it is called as ``listener(job, slot_key, released)``."""
        self._listeners.append(listener)

    def dispatch(self, event: ChangeEvent) -> None:
        """Call every listener with ``event``. A listener that raises is logged and the others
        are still called: one broken listener never stops the feed."""
        for listener in tuple(self._listeners):
            try:
                listener(event.job, event.slot_key, event.released)
            except Exception:
                self.logger.exception(
                    "a change listener failed on %s/%s; the others were still told",
                    event.job,
                    event.slot_key,
                    extra=log_fields(Action.LISTENER_FAILED, event.job),
                )

    def start(
        self,
        next_changes: NextChanges,
        *,
        retry_s: float | None = None,
        delays: Callable[[], Iterator[float]] | None = None,
        errors: tuple[type[BaseException], ...] = (Exception,),
    ) -> None:
        """Start the supervised loop (once): await ``next_changes()`` again and again and
        dispatch what it returns. One of ``errors`` marks an outage: it is logged once
        (``notifications_lost``), the call is tried again after a wait, and the first success
        after it is logged (``notifications_resumed``).

        The waits: ``retry_s`` seconds each, or a fresh series from ``delays()`` for each
        outage (:func:`anarchon.kit.backoff`, say); give one of the two."""
        if (retry_s is None) == (delays is None):
            raise ValueError(
                f"give one of retry_s={retry_s!r} and delays={delays!r}: the waits after a "
                "failed call are fixed or a series, not both or neither"
            )
        if self._task is None:
            waits = delays if delays is not None else lambda: itertools.repeat(retry_s or 0.0)
            self._task = asyncio.ensure_future(self._run(next_changes, waits, errors))
            self._task.add_done_callback(consume)

    async def wait_live(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` seconds for the stream to answer (a subscription made);
        False if it has not by then. The first subscriber waits, so that the changes right
        after it subscribes are not missed while the subscription is still being made."""
        try:
            await asyncio.wait_for(self._live.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    async def stop(self) -> None:
        """Stop the loop, wait for it, and forget the listeners (a backend's subscribers belong
        to one start: the scheduler subscribes again when it starts again).

        Cancels until the cancellation takes: a driver may swallow one (redis-py's socket
        writes on Python 3.11, through ``asyncio.wait_for``, can lose a cancellation that
        arrives as the write completes). A loop that died of an unexpected error is logged."""
        task, self._task = self._task, None
        while task is not None and not task.done():
            task.cancel()
            await asyncio.wait([task], timeout=_CANCEL_WAIT_S)
        if task is not None and not task.cancelled() and task.exception() is not None:
            self.logger.error("the change feed failed", exc_info=task.exception())
        self._live.clear()
        self._lost = False
        self._listeners.clear()
        self._claims.clear()

    def lost(self, error: BaseException) -> None:
        """Record that notifications stopped (logged once per outage)."""
        self._live.clear()
        if not self._lost:
            self._lost = True
            self.logger.warning(
                "change notifications lost: %s; backups check at lease expiry until they resume",
                error,
                extra=log_fields(Action.NOTIFICATIONS_LOST),
            )

    def resumed(self) -> None:
        """Record that notifications flow again (logged once, after :meth:`lost`)."""
        self._live.set()
        if self._lost:
            self._lost = False
            self.logger.info(
                "change notifications resumed", extra=log_fields(Action.NOTIFICATIONS_RESUMED)
            )

    async def _run(
        self,
        next_changes: NextChanges,
        waits: Callable[[], Iterator[float]],
        errors: tuple[type[BaseException], ...],
    ) -> None:
        delays: Iterator[float] | None = None
        while True:
            try:
                events = await next_changes()
            except errors as exc:
                if delays is None:
                    delays = waits()
                else:
                    self.logger.debug("change notifications still lost: %s", exc)
                self.lost(exc)
                await asyncio.sleep(next(delays))
                continue
            delays = None
            self.resumed()
            notices: list[ClaimNotice] = []
            for event in events:
                if isinstance(event, ClaimNotice):
                    notices.append(event)
                else:
                    self.dispatch(event)
            self.dispatch_claims(notices)
