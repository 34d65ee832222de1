"""One bounded call and one retry loop, for every backend.

A backend names only what differs: how its driver's exceptions become anarchon's
(``translate``) and which of them are worth another try (``is_transient``). The rest, written
once here:

* :func:`bounded_call` runs one operation in a task of its own (as :func:`asyncio.shield`
  would) with a time limit. Cancelling the caller always cancels the caller (a driver that
  swallows a cancellation arriving as a write completes cannot keep it waiting); the abandoned
  task is cancelled and its result consumed, so no "exception was never retrieved" is left
  behind; a timeout becomes :class:`~anarchon.errors.BackendUnavailable`; a driver error goes
  through ``translate``.
  A driver that cannot swallow a cancellation may ask for ``inline``: the operation is awaited
  in the caller's own task, its limit a timer that cancels that task (as
  :func:`asyncio.timeout` does), which spares the task and two turns of the event loop per call.
  Its limit can also be kept by a :class:`Deadlines` shared by the calls of one backend: one
  timer for all of them, not one made and cancelled per call (:meth:`Deadlines.call` is that
  call without this function's frame around it).
* :func:`retrying` calls an operation again, on anarchon's backoff, while ``is_transient``
  says the error is temporary, and gives up at a deadline (or after a number of attempts); a
  backend logs each retry with ``on_retry`` and translates the error it finally raises.
* :func:`cancel_and_wait` cancels background tasks and waits for them, cancelling again while
  one is left (a driver's timeout can swallow a cancellation): what a backend's ``stop()``
  uses so that it cannot hang. Their outcomes are consumed: an error a task ended with is
  logged (on the ``logger`` the backend passes), never raised nor left for asyncio's "exception
  was never retrieved".
* :class:`Outage` logs a backend's outage once when its calls start failing and once when it
  answers again, with the same actions and levels on every backend.
* :func:`wait_unless` waits for a task unless something else ends first (a stop, a refusal, a
  deadline), and leaves the task to the caller: what to do with a call still running is the
  caller's choice (cancel and consume it, cancel and wait for its clean-up).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import math
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, NoReturn, TypeVar

from .._retry import backoff
from .._supervisor import cancel_and_wait, consume, wait_unless
from ..errors import AnarchonError, BackendError, BackendUnavailable
from ..logs import Action, log_fields

__all__ = [
    "Deadlines",
    "Outage",
    "Translate",
    "bounded_call",
    "cancel_and_wait",
    "consume",
    "first_line",
    "retrying",
    "wait_unless",
]

T = TypeVar("T")

Translate = Callable[[BaseException], BackendError | None]
"""Turn a driver's exception into :class:`~anarchon.errors.BackendUnavailable` (transient) or
another :class:`~anarchon.errors.BackendError`; None when it is not the driver's (re-raised)."""


async def bounded_call(
    operation: Awaitable[T],
    *,
    where: str,
    timeout_s: float | None,
    translate: Translate,
    limit: str | None = None,
    inline: bool = False,
    deadlines: Deadlines | None = None,
) -> T:
    """Await ``operation`` for at most ``timeout_s`` seconds (None: no limit).

    ``where`` names the backend and its address in messages (``"Redis 127.0.0.1:6379"``,
    never a password); ``limit`` names the limit in the timeout's message as the user set it
    (``"timeout_ms=5000"``; default: ``timeout_s`` in seconds). Raises
    :class:`~anarchon.errors.BackendUnavailable` on a timeout, what ``translate`` returns for a
    driver's error, and anything else (anarchon's own errors, cancellation, bugs) unchanged.

    ``inline``: await ``operation`` (a coroutine) in the caller's task, for a driver that never
    swallows a cancellation (no ``asyncio.wait_for`` of its own on Python 3.11): the same
    answers for about a third of the CPU (around one Redis EVALSHA: 80 000 -> 29 000
    instructions, callgrind), and the operation is cancelled when the limit passes rather
    than abandoned. ``deadlines`` (inline only): keep the limit with that :class:`Deadlines`
    instead of a timer of the call's own.
    """
    if inline:
        if deadlines is not None and timeout_s is not None:
            return await deadlines.call(operation, where, timeout_s, translate, limit)
        return await _inline(operation, where, timeout_s, translate, limit)
    loop = asyncio.get_running_loop()
    answer: asyncio.Future[T] = loop.create_future()
    task = loop.create_task(_relay(operation, answer))
    # The limit is a timer that fails ``answer``, not asyncio.timeout(): the caller's task is
    # never cancelled by it, and it is cheaper (this whole function on an operation that does
    # nothing: 17.8 -> 13.2 us of CPU, Python 3.11); every call of every backend comes here.
    timer = None if timeout_s is None else loop.call_later(timeout_s, _expire, answer)
    try:
        return await answer
    except BaseException as exc:
        # The task still runs unless it handed over the operation's own outcome.
        handed = (
            answer.done()
            and not answer.cancelled()
            and not isinstance(answer.exception(), _Expired)
        )
        if not handed:
            task.cancel()
        task.add_done_callback(functools.partial(_ended, operation))
        if isinstance(exc, asyncio.CancelledError | AnarchonError):
            raise
        if isinstance(exc, _Expired):
            raise _no_answer(where, timeout_s, limit) from None
        _reraise(exc, translate)
    finally:
        if timer is not None:
            timer.cancel()


async def _inline(
    operation: Awaitable[T],
    where: str,
    timeout_s: float | None,
    translate: Translate,
    limit: str | None,
) -> T:
    """:func:`bounded_call` in the caller's task (``inline``), its limit kept by a timer of
    its own."""
    if timeout_s is None:
        try:
            return await operation
        except AnarchonError:
            raise
        except Exception as exc:
            _reraise(exc, translate)
    loop = asyncio.get_running_loop()
    call = _Limit.of_current(loop, timeout_s)
    timer = loop.call_later(timeout_s, call.fire)
    try:
        return await _limited(operation, call, where, timeout_s, translate, limit)
    finally:
        timer.cancel()


class _Limit:
    """The limit of one inline call: its task, its deadline (the loop's clock), whether the
    limit cancelled the task, and how many cancellations were pending at entry."""

    __slots__ = ("deadline", "fired", "pending", "task")

    def __init__(self, task: asyncio.Task[Any], deadline: float) -> None:
        self.task = task
        self.deadline = deadline
        self.fired = False
        # As asyncio.timeout: a cancellation counted beyond the ones pending at entry is the
        # limit's alone if uncancelling brings the count back.
        self.pending = task.cancelling()

    @classmethod
    def of_current(cls, loop: asyncio.AbstractEventLoop, timeout_s: float) -> _Limit:
        """The limit of a call in the current task, ``timeout_s`` from now."""
        task = asyncio.current_task()
        assert task is not None
        return cls(task, loop.time() + timeout_s)

    def fire(self) -> None:
        """The limit passed: cancel the call's task (once)."""
        if not self.fired:
            self.fired = True
            self.task.cancel()


def first_line(exc: BaseException) -> str:
    """The first line of an error's message, or its type's name when it has none (what a
    one-line log record or error says of it)."""
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


class Outage:
    """A backend's outage, logged once when its calls stop being answered
    (``backend_unavailable``, WARNING) and once when one is answered again
    (``backend_recovered``, WARNING), however many calls fail in between.

    :param logger: the backend's logger (``anarchon.backends.<name>``).
    :param where: how the recovery names the backend (``Redis 10.0.0.5:6379/0``).

    :attr:`down` is a plain attribute, so a call's path pays one attribute read when all is
    well: ``if outage.down: outage.answered()``."""

    __slots__ = ("_logger", "_where", "down")

    def __init__(self, logger: logging.Logger, where: str) -> None:
        self._logger = logger
        self._where = where
        self.down = False
        """True from the first unanswered call until a call is answered."""

    def failed(self, error: BaseException) -> None:
        """A call went unanswered with ``error`` (whose first line names the backend, as
        :func:`bounded_call`'s and every backend's translated errors do): logged if this
        starts an outage."""
        if not self.down:
            self.down = True
            self._logger.warning(
                "%s; calls fail until it answers again",
                first_line(error),
                extra=log_fields(Action.BACKEND_UNAVAILABLE),
            )

    def answered(self) -> None:
        """A call was answered: logged if this ends an outage."""
        if self.down:
            self.down = False
            self._logger.warning(
                "%s answers again", self._where, extra=log_fields(Action.BACKEND_RECOVERED)
            )


class Deadlines:
    """The limits of the inline :func:`bounded_call` s of one backend, kept by one timer.

    A call adds its task and deadline and removes them when it ends; the timer, armed for the
    earliest deadline, cancels the task of every call whose limit has passed (as an inline
    call's own timer would) and is armed again for the next deadline. A call that answers in
    time therefore costs a set's add and discard, not a timer handle made and cancelled (and
    later swept out of the event loop's heap): about 25 000 of the 410 000 instructions of a
    Redis claim (callgrind, Python 3.11). Calls one after another re-arm the timer about once
    per limit, not once per call. For one event loop at a time (a backend's).
    """

    __slots__ = ("_at", "_calls", "_loop", "_timer")

    def __init__(self) -> None:
        self._calls: set[_Limit] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._at = math.inf

    def _add(self, call: _Limit, loop: asyncio.AbstractEventLoop) -> None:
        if loop is not self._loop:
            # First use, or a backend started again in another loop: the old timer is moot.
            if self._timer is not None:
                self._timer.cancel()
            self._calls, self._loop, self._timer, self._at = set(), loop, None, math.inf
        self._calls.add(call)
        if call.deadline < self._at:
            self._arm(call.deadline)

    def _arm(self, at: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        assert self._loop is not None
        self._at = at
        self._timer = self._loop.call_at(at, self._expire)

    async def call(
        self,
        operation: Awaitable[T],
        where: str,
        timeout_s: float,
        translate: Translate,
        limit: str | None = None,
    ) -> T:
        """:func:`bounded_call` with ``inline`` and these ``deadlines`` (the same answers as a
        timer of the call's own), for a backend that calls it directly: one coroutine frame
        fewer on every call."""
        loop = asyncio.get_running_loop()
        call = _Limit.of_current(loop, timeout_s)
        self._add(call, loop)
        try:
            return await _limited(operation, call, where, timeout_s, translate, limit)
        finally:
            self._calls.discard(call)

    def _expire(self) -> None:
        """The timer: cancel the calls whose limit passed, arm for the next deadline."""
        assert self._loop is not None
        self._timer, self._at = None, math.inf
        now = self._loop.time()
        following = math.inf
        for call in self._calls:
            if call.fired:
                continue
            if call.deadline <= now:
                call.fire()
            elif call.deadline < following:
                following = call.deadline
        if following < math.inf:
            self._arm(following)


async def _limited(
    operation: Awaitable[T],
    call: _Limit,
    where: str,
    timeout_s: float,
    translate: Translate,
    limit: str | None,
) -> T:
    """Await ``operation`` in ``call``'s task under its limit (a timer or :class:`Deadlines`
    fires it): the limit's cancellation is the call's :func:`_no_answer`, any other one goes
    on; the driver's failure is translated."""
    try:
        return await operation
    except asyncio.CancelledError:
        if call.fired:
            call.fired = False
            if call.task.uncancel() <= call.pending:
                raise _no_answer(where, timeout_s, limit) from None
        raise
    except AnarchonError:
        raise
    except Exception as exc:
        _reraise(exc, translate)
    finally:
        if call.fired:  # the operation answered (or failed) despite the limit's cancellation
            call.task.uncancel()


def _no_answer(where: str, timeout_s: float | None, limit: str | None) -> BackendUnavailable:
    """The error of a call whose limit passed, naming the limit as the user set it."""
    assert timeout_s is not None
    shown = limit if limit is not None else f"{timeout_s:g} s"
    return BackendUnavailable(f"{where}: no answer within {shown}")


def _reraise(exc: BaseException, translate: Translate) -> NoReturn:
    """Raise the backend's own error for ``exc`` (``translate``), else ``exc`` itself."""
    translated = translate(exc) if isinstance(exc, Exception) else None
    if translated is not None:
        raise translated from exc
    raise exc


class _Expired(Exception):
    """The limit of a :func:`bounded_call` passed (never leaves it)."""


def _expire(answer: asyncio.Future[Any]) -> None:
    """A :func:`bounded_call`'s timer: fail its ``answer`` unless the operation answered."""
    if not answer.done():
        answer.set_exception(_Expired())


async def _relay(operation: Awaitable[T], answer: asyncio.Future[T]) -> None:
    """Await ``operation`` in the task of :func:`bounded_call` and hand its outcome to the
    caller's ``answer`` at once (a shield would take two turns of the loop: one to see the task
    done, one to wake the caller). An error is the caller's to see, not the task's; if the
    caller is gone (``answer`` cancelled or expired), the outcome is dropped."""
    try:
        result = await operation
    except Exception as exc:
        if not answer.done():
            answer.set_exception(exc)
        return
    except BaseException as exc:  # cancelled: the caller gave up on it
        if not answer.done():
            answer.set_exception(exc)
        raise
    if not answer.done():
        answer.set_result(result)


def _ended(operation: Awaitable[Any], task: asyncio.Future[Any]) -> None:
    """The task of a :func:`bounded_call` that failed ended (a done callback; one that
    answered has nothing to clean up): mark its outcome seen, and close ``operation`` if the
    task was cancelled before it began awaiting it."""
    consume(task)
    if inspect.iscoroutine(operation) and inspect.getcoroutinestate(operation) == "CORO_CREATED":
        operation.close()


async def retrying(
    operation: Callable[[], Awaitable[T]],
    *,
    is_transient: Callable[[BaseException], bool],
    deadline_s: float,
    first_s: float = 0.1,
    cap_s: float = 5.0,
    max_attempts: int | None = None,
    failed: Exception | None = None,
    on_retry: Callable[[Exception, int], None] | None = None,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> T:
    """Call ``operation`` until it returns, retrying while ``is_transient(error)`` is true.

    Waits follow :func:`anarchon.kit.backoff` (exponential from ``first_s`` to ``cap_s``, with
    jitter). The last error is raised as it is: at once for an error that is not transient;
    for a transient one when the next wait would end at or past ``deadline_s`` seconds after
    the call (on the event loop's clock, which its timers keep), so no attempt starts after
    the deadline, or when ``max_attempts`` attempts have failed (None: no limit).

    ``failed``: the error of a first attempt the caller made itself (a hot path that calls its
    operation directly, as most calls answer at once): it counts as attempt 1 and is judged
    as that attempt's, and ``operation`` makes the attempts after it.
    ``on_retry(error, attempt)``: called before each wait with the transient error of attempt
    number ``attempt`` (from 1), to log it.
    """
    if deadline_s < 0:
        raise ValueError(f"deadline_s={deadline_s!r} must be 0 or more seconds")
    if max_attempts is not None and max_attempts < 1:
        raise ValueError(f"max_attempts={max_attempts!r} must be 1 or more (or None: no limit)")
    loop = asyncio.get_running_loop()
    give_up_at = loop.time() + deadline_s
    delays: Iterator[float] | None = None  # made at the first failure: most calls answer at once
    attempt = 0
    while True:
        attempt += 1
        try:
            if failed is not None:
                raise failed
            return await operation()
        except Exception as exc:
            failed = None
            if not is_transient(exc) or attempt == max_attempts:
                raise
            if delays is None:
                delays = backoff(first=first_s, cap=cap_s)
            delay = next(delays)
            if loop.time() + delay >= give_up_at:
                raise
            if on_retry is not None:
                on_retry(exc, attempt)
        await sleep(delay)
