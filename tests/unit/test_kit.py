"""The backend kit's plumbing: bounded call, retry loop, URL options, change feed, migrations,
and the contract's paired calls."""

from __future__ import annotations

import asyncio
import functools
import gc
import logging
import re
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import closing
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import pytest

from anarchon import (
    BackendError,
    BackendUnavailable,
    InvalidOption,
    MemoryBackend,
    Run,
    RunStatus,
    Scheduler,
    SQLiteBackend,
    Trigger,
    backend_from_url,
)
from anarchon.backend import (
    ChangeEvent,
    ClaimOutcome,
    ClaimRequest,
    FinishRequest,
    LeaseBackend,
    Ticket,
)
from anarchon.control import ControlStore, RunRequest
from anarchon.kit import OUTAGE_ACTIONS, Bound, calls, check_pattern
from anarchon.kit.calls import bounded_call, retrying
from anarchon.kit.feed import ChangeFeed
from anarchon.kit.lease import (
    MAX_MS,
    RunRow,
    answer_existing,
    first_attempt,
    prune_ttl,
    retries_first,
    stored_run,
    ticket_of,
    ttl_cutoff,
    won_outcome,
)
from anarchon.kit.migrations import Additions, Step, migrate
from anarchon.kit.urls import (
    as_given,
    bool_option,
    int_option,
    ms_option,
    split_url,
    str_option,
)
from tests.records import claim_request


def translate(exc: BaseException) -> BackendError | None:
    if isinstance(exc, ConnectionError):
        return BackendUnavailable(f"toy: {exc}")
    if isinstance(exc, KeyError):
        return BackendError(f"toy: {exc}")
    return None


# How a bounded call may keep its limit: a task of its own, inline with a timer of its own,
# inline with a Deadlines shared by the calls.
MODES = ["task", "inline", "deadlines"]


def _mode(mode: str) -> tuple[bool, calls.Deadlines | None]:
    """``inline`` and ``deadlines`` of a bounded call in ``mode``."""
    return mode != "task", calls.Deadlines() if mode == "deadlines" else None


@pytest.mark.parametrize("mode", MODES)
async def test_bounded_call_returns_translates_and_times_out(mode: str) -> None:
    inline, deadlines = _mode(mode)
    bounded_call = functools.partial(calls.bounded_call, inline=inline, deadlines=deadlines)

    async def answer(
        value: object = 1, fail: BaseException | None = None, wait: float = 0
    ) -> object:
        await asyncio.sleep(wait)
        if fail is not None:
            raise fail
        return value

    assert await bounded_call(answer(7), where="toy", timeout_s=1, translate=translate) == 7
    with pytest.raises(BackendUnavailable, match="toy: refused"):
        await bounded_call(
            answer(fail=ConnectionError("refused")), where="x", timeout_s=1, translate=translate
        )
    with pytest.raises(BackendError, match="toy: 'k'") as caught:
        await bounded_call(answer(fail=KeyError("k")), where="x", timeout_s=1, translate=translate)
    assert not isinstance(caught.value, BackendUnavailable)
    with pytest.raises(ZeroDivisionError):  # not the driver's: unchanged
        await bounded_call(
            answer(fail=ZeroDivisionError()), where="x", timeout_s=1, translate=translate
        )
    with pytest.raises(BackendUnavailable, match=r"toy db: no answer within 0\.05 s"):
        await bounded_call(answer(wait=5), where="toy db", timeout_s=0.05, translate=translate)
    with pytest.raises(BackendUnavailable, match=r"toy db: no answer within timeout_ms=50$"):
        await bounded_call(
            answer(wait=5),
            where="toy db",
            timeout_s=0.05,
            limit="timeout_ms=50",
            translate=translate,
        )


async def _hang(started: asyncio.Event, cancelled: asyncio.Event) -> None:
    """An operation that never answers: sets ``started``, and ``cancelled`` when cancelled."""
    started.set()
    try:
        await asyncio.sleep(60)
    except asyncio.CancelledError:
        cancelled.set()
        raise


@pytest.mark.parametrize(
    ("mode", "timeout_s"), [("task", None), ("inline", None), ("inline", 30), ("deadlines", 30)]
)
async def test_bounded_call_cancels_the_abandoned_operation(
    mode: str, timeout_s: float | None
) -> None:
    started, cancelled = asyncio.Event(), asyncio.Event()
    inline, deadlines = _mode(mode)
    caller = asyncio.ensure_future(
        bounded_call(
            _hang(started, cancelled),
            where="x",
            timeout_s=timeout_s,
            translate=translate,
            inline=inline,
            deadlines=deadlines,
        )
    )
    await started.wait()
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    await asyncio.wait_for(cancelled.wait(), 1)


async def test_bounded_call_cancels_the_operation_when_its_caller_is_cancelled_as_it_expires(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The limit passes and the caller is cancelled before it wakes up: the caller ends
    cancelled and the operation, which never answered, is cancelled too."""
    import anarchon.kit.calls as calls

    started, cancelled = asyncio.Event(), asyncio.Event()

    caller: asyncio.Future[None] | None = None
    expire = calls._expire

    def expire_then_cancel(answer: asyncio.Future[None]) -> None:
        expire(answer)
        assert caller is not None
        caller.cancel()

    monkeypatch.setattr(calls, "_expire", expire_then_cancel)
    caller = asyncio.ensure_future(
        bounded_call(_hang(started, cancelled), where="x", timeout_s=0.05, translate=translate)
    )
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert started.is_set()
    await asyncio.wait_for(cancelled.wait(), 1)


async def test_bounded_call_never_waits_for_an_operation_that_swallows_its_cancellation() -> None:
    started, release = asyncio.Event(), asyncio.Event()

    async def stubborn() -> str:
        started.set()
        while True:
            try:
                await release.wait()
                return "late"
            except asyncio.CancelledError:
                continue  # a driver that swallows a cancellation arriving as a write completes

    caller = asyncio.ensure_future(
        bounded_call(stubborn(), where="x", timeout_s=None, translate=translate)
    )
    await started.wait()
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(caller, 1)
    with pytest.raises(BackendUnavailable, match="no answer within"):
        await bounded_call(stubborn(), where="x", timeout_s=0.05, translate=translate)
    release.set()
    await asyncio.sleep(0)


@pytest.mark.parametrize("mode", MODES)
async def test_bounded_call_with_no_time_left_leaves_nothing_behind(mode: str) -> None:
    async def operation() -> None:
        await asyncio.sleep(1)

    inline, deadlines = _mode(mode)
    with pytest.raises(BackendUnavailable, match="no answer within"):
        await bounded_call(
            operation(),
            where="x",
            timeout_s=0,
            translate=translate,
            inline=inline,
            deadlines=deadlines,
        )
    await asyncio.sleep(0)
    gc.collect()  # an operation never awaited, or an error never retrieved, would warn here


async def test_inline_bounded_call_leaves_the_callers_own_cancellation_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Inline, the limit cancels the caller's task: a timeout must not count against the
    caller (its task is not left cancelling), and a cancellation of the caller that arrives
    with the timer is the caller's, not a timeout."""
    with pytest.raises(BackendUnavailable, match="no answer within"):
        await calls.bounded_call(
            asyncio.sleep(5), where="x", timeout_s=0.01, translate=translate, inline=True
        )
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0
    assert (
        await calls.bounded_call(
            asyncio.sleep(0, "ok"), where="x", timeout_s=5, translate=translate, inline=True
        )
        == "ok"
    )

    async def caller() -> None:
        await calls.bounded_call(
            asyncio.sleep(5), where="x", timeout_s=0.05, translate=translate, inline=True
        )

    # The caller is cancelled by someone else in the same turn of the loop as the timer fires.
    fire = calls._Limit.fire

    def cancel_twice(limit: Any) -> None:
        fire(limit)
        limit.task.cancel()

    monkeypatch.setattr(calls._Limit, "fire", cancel_twice)
    outer = asyncio.ensure_future(caller())
    with pytest.raises(asyncio.CancelledError):
        await outer


async def test_deadlines_keep_many_calls_limits_with_one_timer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Calls sharing a Deadlines: each that hangs fails at its own limit (the shorter first,
    whatever the order they began in), the others answer, no task is left cancelling, and
    calls one after another do not make a timer each."""
    deadlines = calls.Deadlines()
    loop = asyncio.get_running_loop()
    armed: list[float] = []
    call_at = loop.call_at

    def counted(when: float, callback: Any, *args: Any, **options: Any) -> asyncio.TimerHandle:
        armed.append(when)
        return call_at(when, callback, *args, **options)

    monkeypatch.setattr(loop, "call_at", counted)

    async def call(wait: float, timeout_s: float) -> tuple[str, float]:
        began = loop.time()
        try:
            await bounded_call(
                asyncio.sleep(wait),
                where="x",
                timeout_s=timeout_s,
                translate=translate,
                inline=True,
                deadlines=deadlines,
            )
        except BackendUnavailable as exc:
            assert f"no answer within {timeout_s:g} s" in str(exc)
            task = asyncio.current_task()
            assert task is not None and task.cancelling() == 0
            return "timeout", loop.time() - began
        return "answer", loop.time() - began

    results = await asyncio.gather(
        call(60, 0.6), call(60, 0.2), call(0.05, 5), call(0.3, 0.45), call(60, 0.4)
    )
    assert [kind for kind, _ in results] == ["timeout", "timeout", "answer", "answer", "timeout"]
    for (_, took), limit in zip([results[0], results[1], results[4]], [0.6, 0.2, 0.4], strict=True):
        assert limit <= took < limit + 0.25, results
    armed.clear()
    for _ in range(200):
        assert (
            await bounded_call(
                asyncio.sleep(0, "ok"),
                where="x",
                timeout_s=5,
                translate=translate,
                inline=True,
                deadlines=deadlines,
            )
            == "ok"
        )
    assert len(armed) <= 1, armed


async def test_retrying_retries_transient_errors_only() -> None:
    calls: list[int] = []

    async def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise BackendUnavailable("down")
        return "up"

    async def no_sleep(_: float) -> None:
        return None

    transient = lambda exc: isinstance(exc, BackendUnavailable)  # noqa: E731
    assert await retrying(flaky, is_transient=transient, deadline_s=5, sleep=no_sleep) == "up"
    assert len(calls) == 3

    async def broken() -> None:
        calls.append(1)
        raise BackendError("permanent")

    calls.clear()
    with pytest.raises(BackendError, match="permanent"):
        await retrying(broken, is_transient=transient, deadline_s=5, sleep=no_sleep)
    assert len(calls) == 1

    async def down() -> None:
        raise BackendUnavailable("still down")

    with pytest.raises(BackendUnavailable, match="still down"):
        await retrying(down, is_transient=transient, deadline_s=0.05, first_s=0.01)
    with pytest.raises(ValueError, match="deadline_s=-1"):
        await retrying(down, is_transient=transient, deadline_s=-1)


async def test_retrying_with_its_defaults_never_waits_past_the_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every option at its default (waits from 0.1 s doubling to 5 s, no attempt limit, no
    first error, no callback, asyncio's sleep): with the jitter pinned (waits 0.1, 0.2, 0.4 s),
    a deadline of 0.5 s allows attempts at 0, 0.1 and 0.3 s; the next wait would end at 0.7 s,
    so the third error is raised then, with no attempt squeezed in at the deadline."""
    import random

    monkeypatch.setattr(random, "random", lambda: 1.0)
    loop = asyncio.get_running_loop()
    attempts: list[float] = []

    async def down() -> None:
        attempts.append(loop.time())
        raise BackendUnavailable(f"down {len(attempts)}")

    transient = lambda exc: isinstance(exc, BackendUnavailable)  # noqa: E731
    started = loop.time()
    with pytest.raises(BackendUnavailable, match="down 3"):
        await retrying(down, is_transient=transient, deadline_s=0.5)
    after = [at - started for at in attempts]
    assert len(after) == 3, after
    assert 0.09 <= after[1] < 0.25 and 0.29 <= after[2] < 0.5, after


async def test_retrying_counts_attempts_and_reports_each_retry() -> None:
    """``max_attempts`` bounds the attempts, a caller's own first attempt (``failed``) counts as
    attempt 1, and ``on_retry`` hears each transient error before its wait."""
    calls_made: list[int] = []
    retries: list[tuple[str, int]] = []

    async def no_sleep(_: float) -> None:
        return None

    async def down() -> None:
        calls_made.append(1)
        raise BackendUnavailable(f"down {len(calls_made)}")

    def heard(exc: Exception, attempt: int) -> None:
        retries.append((str(exc), attempt))

    transient = lambda exc: isinstance(exc, BackendUnavailable)  # noqa: E731
    retry_down = functools.partial(
        retrying, down, is_transient=transient, deadline_s=60, on_retry=heard, sleep=no_sleep
    )
    with pytest.raises(BackendUnavailable, match="down 3"):
        await retry_down(max_attempts=3)
    assert len(calls_made) == 3
    assert retries == [("down 1", 1), ("down 2", 2)]

    calls_made.clear()
    retries.clear()
    first = BackendUnavailable("first")
    with pytest.raises(BackendUnavailable, match="down 1"):
        await retry_down(max_attempts=2, failed=first)
    assert len(calls_made) == 1  # attempt 2: the first was the caller's
    assert retries == [("first", 1)]

    async def up() -> str:
        calls_made.append(1)
        return "up"

    calls_made.clear()
    assert await retrying(up, is_transient=transient, deadline_s=60, failed=first) == "up"
    assert len(calls_made) == 1
    with pytest.raises(BackendError, match="refused"):  # not transient: raised, no attempt
        await retrying(up, is_transient=transient, deadline_s=60, failed=BackendError("refused"))
    assert len(calls_made) == 1
    with pytest.raises(ValueError, match="max_attempts=0 must be 1 or more"):
        await retrying(up, is_transient=transient, deadline_s=60, max_attempts=0)


def test_split_url_takes_known_options_and_refuses_unknown_ones() -> None:
    known = {
        "size": int_option(Bound(1, 10)),
        "tls": bool_option,
        "prefix": str_option,
        "wait_ms": ms_option(Bound(0, 60_000)),
    }
    split = split_url("toy://u:pw@host/x?size=3&tls=yes&prefix=a:&wait_ms=500", known)
    assert split.options == {"size": 3, "tls": True, "prefix": "a:", "wait_ms": 500}
    assert (
        split.url == "toy://u:pw@host/x"
        and split.shown == "toy://u:***@host/x?size=3&tls=yes&prefix=a:&wait_ms=500"
    )
    with pytest.raises(InvalidOption) as caught:
        split_url("toy://u:pw@host/x?colour=red", known, backend="Toy")
    text = str(caught.value)
    assert "'colour'" in text and "u:***@host" in text and "pw" not in text
    assert "prefix, size, tls, wait_ms" in text
    passed = split_url("toy://host/?size=2&socket_timeout=3", known, pass_on=True)
    assert passed.options == {"size": 2} and passed.url == "toy://host/?socket_timeout=3"
    # Passed on exactly as written: '+' and %20 need not mean the same to the driver.
    raw = split_url("toy://host/?opt=a%20b&size=2&name=c+d#f", known, pass_on=True)
    assert raw.url == "toy://host/?opt=a%20b&name=c+d#f" and raw.options == {"size": 2}
    assert split_url("toy://host/?prefix=a+b%2Bc", known).options == {"prefix": "a b+c"}
    kept = split_url("toy://host/?schema=&size=1", {**known, "schema": as_given})
    assert kept.options == {"schema": "", "size": 1}  # as_given keeps an empty value
    for bad, rule in [
        ("size=11", "from 1 to 10"),
        ("size=x", "from 1 to 10"),
        ("tls=maybe", "true or false"),
        ("prefix=", "must not be empty"),
        ("size=1&size=2", "twice"),
        ("wait_ms=-1", "from 0 to 60000"),
    ]:
        with pytest.raises(InvalidOption, match=rule):
            split_url(f"toy://host/?{bad}", known)


def test_check_pattern_returns_the_value_or_names_it_and_the_rule() -> None:
    rule = re.compile(r"[a-z]+")
    assert check_pattern("schema", "abc", rule, "must be lower-case letters") == "abc"
    for bad in ("aB", "", 3, None):
        with pytest.raises(InvalidOption, match=r"^schema=.* must be lower-case letters$"):
            check_pattern("schema", bad, rule, "must be lower-case letters")


def test_ticket_of_makes_one_ticket_from_a_request_and_from_its_stored_row() -> None:
    req = ClaimRequest(
        job="sync", slot=60_000, run_id="r1", token="t1", instance="i1", trigger=Trigger.CATCH_UP
    )
    ticket = ticket_of(req, attempt=1, fence=7, started_at_ms=62_000)
    named = (ticket.job, ticket.slot, ticket.slot_key, ticket.run_id, ticket.token, ticket.instance)
    assert named == ("sync", 60_000, "60000", "r1", "t1", "i1")
    assert ticket.trigger is Trigger.CATCH_UP
    row = first_attempt(req, 62_000, RunStatus.RUNNING, None, slot=60_000, token="t1", fence=7)
    row.lease_expires_at = 92_000
    row.trigger = "catch-up"  # as a backend reads it back: text
    held = row.ticket(30_000, 62_500, None)
    assert held.trigger is Trigger.CATCH_UP
    assert held == replace(
        ticket, lease_ms=30_000, lease_expires_at_ms=92_000, backend_now_ms=62_500
    )


def test_outage_actions_are_the_four_names() -> None:
    assert OUTAGE_ACTIONS == (
        "backend_unavailable",
        "backend_recovered",
        "notifications_lost",
        "notifications_resumed",
    )


async def test_feed_isolates_a_failing_listener_and_logs_each_outage_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    feed = ChangeFeed("toy")
    heard: list[tuple[str, str, bool]] = []

    def broken(job: str, slot_key: str, released: bool) -> None:
        raise RuntimeError("listener bug")

    feed.add(broken)
    feed.add(lambda *args: heard.append(args))
    answers: list[object] = [
        [ChangeEvent("a", "1", True)],
        BackendUnavailable("gone"),
        BackendUnavailable("gone"),
        [ChangeEvent("b", "2", False)],
    ]
    done = asyncio.Event()

    async def next_changes() -> Sequence[ChangeEvent]:
        if not answers:
            done.set()
            await asyncio.sleep(60)
        answer = answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        assert isinstance(answer, list)
        return answer

    with caplog.at_level(logging.INFO, logger="anarchon.backends.toy"):
        feed.start(next_changes, retry_s=0.01, errors=(BackendError,))
        await asyncio.wait_for(done.wait(), 2)
        await feed.stop()
    assert heard == [("a", "1", True), ("b", "2", False)]
    actions = [getattr(r, "action", None) for r in caplog.records]
    assert actions == [
        "listener_failed",
        "notifications_lost",
        "notifications_resumed",
        "listener_failed",
    ]
    assert not feed.running


async def test_feed_waits_for_its_stream_backs_off_per_outage_and_forgets_listeners_on_stop() -> (
    None
):
    feed = ChangeFeed("toy")
    feed.add(lambda *args: None)
    calls = 0
    series = 0
    six = asyncio.Event()

    def delays() -> Iterator[float]:
        nonlocal series
        series += 1
        return iter([0.01, 0.02, 0.04])

    async def next_changes() -> Sequence[ChangeEvent]:
        nonlocal calls
        calls += 1
        if calls == 6:
            six.set()
        if calls in (1, 2, 4):  # two failures, a success, one failure, then successes
            raise BackendUnavailable("not yet")
        await asyncio.sleep(0.01)
        return []

    feed.start(next_changes, delays=delays, errors=(BackendError,))
    assert await feed.wait_live(2)
    await asyncio.wait_for(six.wait(), 2)
    assert series == 2  # a fresh series of waits for each outage
    await feed.stop()
    assert not feed.listeners and not feed.live


async def test_feed_stop_cancels_until_it_takes_and_logs_a_loop_that_died(
    caplog: pytest.LogCaptureFixture,
) -> None:
    swallowed = 0

    async def stubborn() -> Sequence[ChangeEvent]:
        nonlocal swallowed
        while True:
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                swallowed += 1
                if swallowed == 1:  # a driver that loses the first cancellation
                    continue
                raise

    feed = ChangeFeed("toy")
    feed.start(stubborn, retry_s=0.01)
    await asyncio.sleep(0)
    await asyncio.wait_for(feed.stop(), 5)
    assert swallowed == 2 and not feed.running

    async def broken() -> Sequence[ChangeEvent]:
        raise KeyError("bug")

    with caplog.at_level(logging.ERROR, logger="anarchon.backends.toy"):
        feed.start(broken, retry_s=0.01, errors=(BackendError,))
        await asyncio.sleep(0.01)
        await feed.stop()
    assert [r.getMessage() for r in caplog.records] == ["the change feed failed"]
    with pytest.raises(ValueError, match="retry_s"):
        feed.start(broken)
    with pytest.raises(ValueError, match="retry_s"):
        feed.start(broken, retry_s=1, delays=lambda: iter([1.0]))


STEPS = [
    Step(1, "runs", "CREATE TABLE runs (id INTEGER); CREATE INDEX runs_id ON runs (id)"),
    Step(2, "jobs", "CREATE TABLE jobs (name TEXT)"),
]
VERSION: dict[str, Any] = {
    "create_table": "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)",
    "read_version": "SELECT max(version) FROM schema_version",
    "write_version": "INSERT INTO schema_version (version) VALUES (?)",
    "where": "toy.db",
}


def test_migrate_runs_pending_steps_once_and_refuses_newer_stores() -> None:
    with closing(sqlite3.connect(":memory:")) as conn:
        assert [s.name for s in migrate(conn, STEPS[:1], **VERSION)] == ["runs"]
        assert [s.name for s in migrate(conn, STEPS, **VERSION)] == ["jobs"]
        assert migrate(conn, STEPS, **VERSION) == []
        tables = {
            name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")
        }
        assert {"runs", "jobs", "schema_version"} <= tables
        with pytest.raises(
            BackendError, match=r"toy\.db: database schema version 2, newer .* upgrade"
        ):
            migrate(conn, STEPS[:1], **VERSION)
        with pytest.raises(ValueError, match=r"numbered 1, 2, 3 ... in order, not \[2\]"):
            migrate(conn, STEPS[1:], **VERSION)


ADDITIONS = Additions(
    create_table="CREATE TABLE IF NOT EXISTS additions (version INTEGER NOT NULL)",
    read_version="SELECT max(version) FROM additions",
    write_version="INSERT INTO additions (version) VALUES (?)",
)


def test_an_additive_step_is_recorded_apart_and_older_code_opens_the_store() -> None:
    note = Step(3, "note", "ALTER TABLE jobs ADD COLUMN note TEXT", additive=True)
    more = Step(4, "more", "CREATE TABLE more (x INTEGER)")

    def versions(conn: sqlite3.Connection, table: str) -> list[int]:
        return [v for (v,) in conn.execute(f"SELECT version FROM {table} ORDER BY 1")]

    with closing(sqlite3.connect(":memory:")) as conn:
        ran = migrate(conn, [*STEPS, note], **VERSION, additions=ADDITIONS)
        assert [s.name for s in ran] == ["runs", "jobs", "note"]
        assert (versions(conn, "schema_version"), versions(conn, "additions")) == ([1, 2], [3])
        # Code that knows steps 1 and 2 only, with or without the additions table, and this
        # code again: nothing to run, nothing refused.
        assert migrate(conn, STEPS, **VERSION) == []
        assert migrate(conn, STEPS, **VERSION, additions=ADDITIONS) == []
        assert migrate(conn, [*STEPS, note], **VERSION, additions=ADDITIONS) == []
        # A later step that is not additive goes to the version table: older code refuses it.
        ran = migrate(conn, [*STEPS, note, more], **VERSION, additions=ADDITIONS)
        assert [s.name for s in ran] == ["more"]
        assert versions(conn, "schema_version") == [1, 2, 4]
        with pytest.raises(BackendError, match=r"version 4, newer .* understands \(3\)"):
            migrate(conn, [*STEPS, note], **VERSION, additions=ADDITIONS)
    with closing(sqlite3.connect(":memory:")) as conn:
        # Without an additions table an additive step is recorded as any other.
        assert len(migrate(conn, [*STEPS, note], **VERSION)) == 3
        assert versions(conn, "schema_version") == [1, 2, 3]


class _Half(LeaseBackend):
    """Implements the batch form of finish and renew, the single form of last_slot."""

    async def claim(self, requests: Sequence[ClaimRequest]) -> list[ClaimOutcome]:
        return []

    async def history(self, job: str, limit: int = 100) -> list[Run]:
        return []

    async def take_over(self, request: object) -> object:  # type: ignore[override]
        return None

    async def release(self, ticket: Ticket, reason: str) -> None:
        return None

    async def finish_many(self, items: Sequence[object]) -> list[Run | BackendError]:
        return [BackendError("refused") for _ in items]

    async def renew_many(self, tickets: Sequence[Ticket]) -> list[Ticket | BackendError]:
        return list(tickets)

    async def last_slot(self, job: str) -> int | None:
        return 5 if job == "a" else None


async def test_either_form_of_a_paired_call_serves_both() -> None:
    backend = _Half()
    assert await backend.last_slots(["a", "b"]) == {"a": 5, "b": None}
    with pytest.raises(BackendError, match="refused"):
        await backend.finish(object(), "succeeded", None)  # type: ignore[arg-type]
    ticket = object()
    assert await backend.renew(ticket) is ticket  # type: ignore[arg-type]


def test_a_backend_with_neither_form_cannot_be_made() -> None:
    class NoRenew(_Half):
        renew_many = LeaseBackend.renew_many

    with pytest.raises(TypeError, match=r"NoRenew implements neither renew\(\) nor renew_many\(\)"):
        NoRenew()


def test_sqlite_urls_take_their_options_through_the_kit(tmp_path: Path) -> None:
    backend = backend_from_url(f"sqlite:///{tmp_path}/a.db?history_size=5&busy_timeout_ms=200")
    assert isinstance(backend, SQLiteBackend)
    assert backend.history_size == 5 and backend.path == tmp_path / "a.db"
    with pytest.raises(
        InvalidOption, match=r"unknown option 'mode'.*busy_timeout_ms, history_size"
    ):
        backend_from_url(f"sqlite:///{tmp_path}/a.db?mode=ro")


def test_memory_urls_take_their_options_through_the_kit() -> None:
    """``memory://`` ignored every option (``?history_size=0``, ``?history_size=abc``,
    ``?bogus=1``); it now takes ``history_size`` by the rule of the other schemes."""
    default = backend_from_url("memory://")
    assert isinstance(default, MemoryBackend) and repr(default) == (
        "MemoryBackend(history_size=1000)"
    )
    assert repr(backend_from_url("memory://?history_size=5")) == "MemoryBackend(history_size=5)"
    assert repr(Scheduler("memory://?history_size=7").backend) == "MemoryBackend(history_size=7)"
    for url, said in (
        (
            "memory://?history_size=0",
            "history_size=0 for the backend URL 'memory://?history_size=0' is out of range: it "
            "must be an integer from 1 to 1000000",
        ),
        (
            "memory://?history_size=abc",
            "history_size='abc' in the backend URL 'memory://?history_size=abc' must be an "
            "integer from 1 to 1000000",
        ),
        (
            "memory://?bogus=1",
            "the memory URL 'memory://?bogus=1' has an unknown option 'bogus'; the options it "
            "takes are: history_size",
        ),
        (
            "memory://db.example:1/x",
            "the memory URL 'memory://db.example:1/x' names a place; memory has none",
        ),
    ):
        with pytest.raises(InvalidOption) as caught:
            backend_from_url(url)
        assert str(caught.value).startswith(said), caught.value
        with pytest.raises(InvalidOption):
            Scheduler(url)


@pytest.mark.parametrize("slot", [1_700_000_000_000, None])
@pytest.mark.parametrize("requested_by", [None, "alice"])
def test_a_won_claim_made_from_its_request_is_the_one_made_from_its_record(
    slot: int | None, requested_by: str | None
) -> None:
    """won_outcome (what a backend answering ``[now, fence]`` gives) equals the answer made
    from the stored record of attempt 1, and stored_run the record's own run, also from
    JSON's floats."""
    req = replace(
        claim_request("j", 0, "i1", lease_ms=30_000), slot=slot, requested_by=requested_by
    )
    now, fence = 1_700_000_000_123, 1_700_000_000_124
    row = first_attempt(
        req, now, RunStatus.RUNNING, None, slot=slot, token=req.token, fence=fence,
        lease_expires_at=now + req.lease_ms,
    )  # fmt: skip
    assert won_outcome(req, now, fence) == answer_existing(row, req, now)
    stored = {name: getattr(row, name) for name in RunRow.__dataclass_fields__}
    stored["trigger"] = str(req.trigger)
    assert stored_run(stored) == row.to_run()
    assert stored_run({**stored, "fence": float(fence), "started_at": float(now)}) == row.to_run()


def _retry(request_id: str) -> RunRequest:
    return RunRequest(
        id=request_id,
        job="job",
        trigger=Trigger.RETRY,
        key=f"60000-retry-{request_id}",
        slot=60_000,
        due_ms=61_000,
        requested_by="retry",
        requested_at_ms=60_500,
    )


async def test_retries_first_stores_the_retries_and_names_each_refusal() -> None:
    """A backend that cannot store a result and its retry in one step (NATS, Redis on a
    cluster) stores the retries first, in order: a refused one is answered by its index (its
    result is then not sent), an item without one is passed over, and an unavailable store
    fails the whole call."""
    stored: list[str] = []

    class Store:
        async def request(self, request: RunRequest) -> bool:
            if request.id == "refused":
                raise BackendError("no room for it")
            if request.id == "down":
                raise BackendUnavailable("the store is down")
            stored.append(request.id)
            return True

    store = cast(ControlStore, Store())
    ticket = cast(Ticket, object())

    def item(retry: str | None) -> FinishRequest:
        return FinishRequest(
            ticket, RunStatus.FAILED, "boom", None if retry is None else _retry(retry)
        )

    refused = await retries_first(store, [item("a"), item(None), item("refused"), item("b")])
    assert stored == ["a", "b"]
    assert list(refused) == [2] and "no room for it" in str(refused[2])
    assert await retries_first(store, [item(None)]) == {}
    with pytest.raises(BackendUnavailable, match="the store is down"):
        await retries_first(store, [item("c"), item("down"), item("d")])
    assert stored == ["a", "b", "c"]


@pytest.mark.parametrize(
    ("ttl", "kept"),
    [(None, None), (0, None), (-5, None), (1, 1), (86_400_000, 86_400_000), (2**60, MAX_MS)],
)
def test_prune_ttl_is_the_ttl_every_backend_prunes_by(ttl: int | None, kept: int | None) -> None:
    """No TTL (unset, 0 or negative) prunes nothing by age; a TTL past MAX_MS keeps all, as the
    PostgreSQL statement, the Redis script and ttl_cutoff (SQLite, memory) all see it."""
    assert prune_ttl(ttl) == kept
    assert ttl_cutoff(10**15, ttl) == (None if kept is None else 10**15 - kept)
