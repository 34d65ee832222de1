"""Many jobs' history at once (``Backend.histories``): one read of every job's subjects, when
that reads less than a read per job.

A job's history is every message on its two subjects (claims and results, at most
``history_size`` each), read through a short-lived consumer (:meth:`NatsBackend.history`): a
consumer made and deleted per job, 3 000 of them for ``anarchon jobs`` at 3 000 jobs. One
consumer filtered on every job's subjects (:data:`EVERY_JOB`) reads all of them in one go, but
reads the jobs nobody asked for too. So the stream's info is asked first for the messages each
job subject holds (one request per page of subjects), and the jobs are read together when that
costs at most :data:`MESSAGES_PER_READ` messages more per job than reading them one by one, and
holds at most :data:`MAX_MESSAGES` messages in memory at once; otherwise each job asked for that
holds a message is read on its own (the default ``Backend.histories``, a few dozen at a time).
Either way a job whose subjects hold nothing costs no read.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Final

from ...kit import Run
from . import _records as records
from . import _subjects as subjects
from ._connection import Connection
from ._records import Stored

__all__ = ["EVERY_JOB", "MAX_MESSAGES", "MESSAGES_PER_READ", "read_histories"]

EVERY_JOB: Final = "{prefix}*.*"
"""A consumer filter for the subjects of every job of a prefix (two tokens after it: the job,
then ``claims`` or ``results``; a longer prefix sharing the stream has more)."""
MESSAGES_PER_READ: Final = 100
"""Messages a read of every job may deliver beyond those of the jobs asked for, per job asked
for: a consumer made and deleted costs more than that many messages delivered."""
MAX_MESSAGES: Final = 200_000
"""The most messages a read of every job holds at once (about 300 bytes each)."""
_KINDS: Final = ("claims", "results")


async def read_histories(
    conn: Connection,
    stream: str,
    prefix: str,
    names: Sequence[str],
    limit: int,
    each: Callable[[Sequence[str]], Awaitable[dict[str, list[Run]]]],
) -> dict[str, list[Run]]:
    """Up to ``limit`` runs of each of ``names`` (distinct, checked), newest first, as the
    job's own read answers them: read together, or by ``each(jobs)`` (a read per job)."""
    held = await conn.retry(
        lambda _: _messages_per_job(conn, stream, prefix),
        "counting the messages of the jobs' subjects",
        conn.retry_deadline(),
    )
    found: dict[str, list[Run]] = {job: [] for job in names}
    asked = [job for job in names if held.get(job)]
    wanted = sum(held[job] for job in asked)
    everything = sum(held.values())
    if len(asked) > 1 and everything <= min(wanted + MESSAGES_PER_READ * len(asked), MAX_MESSAGES):
        by_job: dict[str, list[Stored]] = {}
        filter_subject = EVERY_JOB.format(prefix=prefix)
        doing = f"reading the history of {len(asked)} jobs"
        for message in await conn.read_all(filter_subject, doing):
            job = message.subject[len(prefix) :].partition(".")[0]
            by_job.setdefault(job, []).append(message)
        for job in asked:
            found[job] = records.merge(by_job.get(job, ()), prefix, job)[:limit]
        return found
    found.update(await each(asked))
    return found


async def _messages_per_job(conn: Connection, stream: str, prefix: str) -> dict[str, int]:
    """The messages each job of ``prefix`` holds on its two subjects (jobs that hold none are
    left out), from the stream's info, page by page."""
    held: dict[str, int] = {}
    seen = 0
    while True:
        body = {"subjects_filter": EVERY_JOB.format(prefix=prefix), "offset": seen}
        info = await conn.api(subjects.API.format(verb="STREAM.INFO", stream=stream), body)
        page: dict[str, int] = (info.get("state") or {}).get("subjects") or {}
        for subject, count in page.items():
            job, _, kind = subject[len(prefix) :].partition(".")
            if kind in _KINDS:
                held[job] = held.get(job, 0) + int(count)
        seen += len(page)
        if not page or seen >= int(info.get("total", seen)):
            return held
