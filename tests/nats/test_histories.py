"""Many jobs' history at once (``_histories``): read with one consumer on every job's subjects
when that reads few messages beyond the jobs asked for, else one consumer per job that holds
messages; both answer what each job's own history read answers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from anarchon import RunStatus, Trigger
from anarchon.backends.nats import NatsBackend
from anarchon.backends.nats import _histories as histories_module
from anarchon.testing.contract import SLOT, request

Make = Callable[..., Any]


async def _record(backend: NatsBackend, job: str, runs: int) -> None:
    for n in range(runs):
        [won] = await backend.claim([request(job, SLOT + n * 1000)])
        assert won.ticket is not None
        status = RunStatus.FAILED if n % 3 == 1 else RunStatus.SUCCEEDED
        if n < runs - 1:  # the newest one stays running
            await backend.finish(won.ticket, status, "boom" if n % 3 == 1 else None)
    await backend.claim([request(job, None, trigger=Trigger.MANUAL)])


def _reads(backend: NatsBackend, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The filter subjects of the backend's reads from now on."""
    seen: list[str] = []
    read_all = backend._conn.read_all

    async def counted(filter_subject: str, doing: str) -> Any:
        seen.append(filter_subject)
        return await read_all(filter_subject, doing)

    monkeypatch.setattr(backend._conn, "read_all", counted)
    return seen


async def test_many_jobs_are_read_with_one_consumer(
    make: Make, names: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    backend: NatsBackend = await make()
    _, prefix = names
    for job, runs in (("a", 4), ("b", 2), ("c", 1)):
        await _record(backend, job, runs)
    expected = {job: await backend.history(job, 3) for job in ("a", "b", "never")}
    reads = _reads(backend, monkeypatch)
    found = await backend.histories(["a", "b", "never"], 3)
    assert found == expected
    assert reads == [f"{prefix}*.*"]  # c's few messages are read too, once
    assert [r.status for r in found["a"]] == [
        RunStatus.RUNNING,
        RunStatus.RUNNING,
        RunStatus.SUCCEEDED,
    ]


async def test_jobs_among_many_others_are_read_one_by_one(
    make: Make, names: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read of every job would deliver the others' messages too: past MESSAGES_PER_READ
    per job asked for, each job that holds messages is read on its own; one without none."""
    backend: NatsBackend = await make()
    _, prefix = names
    for job, runs in (("a", 3), ("b", 2), ("busy", 12)):
        await _record(backend, job, runs)
    monkeypatch.setattr(histories_module, "MESSAGES_PER_READ", 2)
    expected = {job: await backend.history(job) for job in ("a", "b", "never")}
    reads = _reads(backend, monkeypatch)
    found = await backend.histories(["a", "b", "never"])
    assert found == expected
    assert sorted(reads) == [f"{prefix}a.*", f"{prefix}b.*"]
    assert await backend.histories(["a", "b"], 0) == {"a": [], "b": []}
