"""Steering the cluster: pauses and run requests, kept in the backend every instance shares.

A **pause** stops every instance from running a job's slots (or every job's, :data:`ALL_JOBS`)
until it is resumed or its ``until_ms`` passes. Lease backends check it inside their atomic
claim, so no instance can start a slot after the pause is stored; a paused slot is recorded
``skipped`` with the reason ``paused by <who>`` (:func:`paused_reason`) once, and runs already
running are not touched. Manual runs are not paused: an operator who triggers a paused job
means it.

A **run request** asks the cluster to run a job once: ``anarchon trigger`` stores one
(:attr:`~anarchon.Trigger.MANUAL`), and a failed run stores one for its retry
(:attr:`~anarchon.Trigger.RETRY`, due after the job's backoff). Every instance that carries the
job reads the requests that are due about once a second and claims each under its
:attr:`RunRequest.key`; the claim decides, as for any slot, that exactly one instance runs it.
The request is then removed.

A run request is **cancelled** (``anarchon cancel``, :func:`anarchon.steering.cancel_requests`)
through the same claim: the canceller claims the request's key with a skip reason
(:func:`cancelled_reason`, cause :attr:`~anarchon.SkipCause.CANCELLED`), then removes the
request. The backend decides the race with an instance that read the request just before, as it
decides any two claims of one key: if the cancellation is recorded first, every claim of the key
is answered ``skipped`` and nobody runs it; if an instance's claim won first, the run goes ahead
and the cancellation answers that run (it was too late). A backend needs nothing more than its
claim for this (a broker that de-duplicates claims for a window, NATS, keeps the cancellation
for its whole duplicate window: far longer than an instance takes to claim a request it read).

A backend offers both through :meth:`anarchon.backend.Backend.control`, which returns a
:class:`ControlStore`. Times are epoch milliseconds on the backend's clock.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, asdict, dataclass, fields
from typing import Any, ClassVar, Final, Protocol, Self, runtime_checkable

from ._models import Trigger, ms_to_datetime
from ._times import LATEST_MS

__all__ = [
    "ALL_JOBS",
    "CANCELLED_BY",
    "MAX_UNTIL_MS",
    "PAUSED",
    "ControlStore",
    "Pause",
    "RunRequest",
    "active_pause",
    "cancelled_reason",
    "paused_reason",
    "retry_key",
]

ALL_JOBS: Final = "*"
"""The job name of a whole-cluster pause (``anarchon pause --all``)."""
MAX_UNTIL_MS: Final = LATEST_MS
"""The latest end a pause has: 9998-12-31T23:59:59.999Z, the last time anarchon handles. A stored
end past it (earlier versions took any) reads as none: the pause holds until resumed. A backend
that reads pauses in a language of its own (SQL, Lua) treats such an end the same."""
PAUSED: Final = "paused by "
"""Prefix of the reason of a slot skipped because its job was paused."""
CANCELLED_BY: Final = "cancelled by "
"""Prefix of the reason of a run request cancelled before any instance claimed it."""
PAUSED_TRIGGERS: Final = frozenset({Trigger.SCHEDULE, Trigger.CATCH_UP, Trigger.RETRY})
"""The triggers a pause holds back; manual runs still run."""


# How a stored value becomes the value of a field, by the field's annotation.
_READERS: Final[dict[str, Callable[[Any], Any]]] = {
    "str": str,
    "int": int,
    "int | None": lambda value: None if value is None else int(value),
    "Trigger": Trigger,
}


class _Stored:
    """What a pause and a run request share: the plain values a store keeps of them (columns,
    query parameters) and the JSON document (which ``--json`` prints)."""

    __slots__ = ()
    __dataclass_fields__: ClassVar[dict[str, Any]]

    def to_dict(self) -> dict[str, Any]:
        """The fields by name, as a store keeps them."""
        return asdict(self)

    def to_json(self) -> str:
        """The JSON document a store keeps."""
        return json.dumps(self.to_dict(), separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> Self:
        """Read back what :meth:`to_json` wrote."""
        return cls.from_dict(json.loads(text))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Self:
        """Read back what :meth:`to_dict` gave (a row, a document): each field by its type; a
        field left out takes its default (None when it may be None); :class:`KeyError` names a
        required field that is missing."""
        values: dict[str, Any] = {}
        for field in fields(cls):
            kind = str(field.type)
            if field.name in data:
                values[field.name] = _READERS[kind](data[field.name])
            elif kind == "int | None":
                values[field.name] = None
            elif field.default is MISSING:
                raise KeyError(field.name)
        return cls(**values)


@dataclass(frozen=True, slots=True, kw_only=True)
class Pause(_Stored):
    """One job (or :data:`ALL_JOBS`) paused by someone, until resumed or ``until_ms``."""

    job: str
    """The paused job's name, or :data:`ALL_JOBS` for a whole-cluster pause."""
    by: str
    """Who paused it (``user@host`` by default)."""
    at_ms: int
    """When it was paused (backend clock)."""
    until_ms: int | None = None
    """When it ends by itself (backend clock); None: until resumed. An end past
    :data:`MAX_UNTIL_MS` (9998-12-31), which earlier versions stored when given one (epoch
    microseconds by mistake), reads as None: such a pause holds until resumed."""

    def __post_init__(self) -> None:
        # A stored end no datetime can hold would break every reader (the claim's reason, the
        # jobs table, the dashboard): it means "never", so it is read as no end at all.
        if self.until_ms is not None and self.until_ms > MAX_UNTIL_MS:
            object.__setattr__(self, "until_ms", None)

    def active(self, now_ms: int) -> bool:
        """True while the pause holds at ``now_ms`` (backend clock)."""
        return self.until_ms is None or now_ms < self.until_ms


def paused_reason(pause: Pause) -> str:
    """The reason a slot skipped under ``pause`` records: ``paused by alice@web-1`` (with
    ``until <iso>`` when it ends by itself, and ``(all jobs)`` for a whole-cluster pause)."""
    text = f"{PAUSED}{pause.by}"
    if pause.job == ALL_JOBS:
        text += " (all jobs)"
    until = ms_to_datetime(pause.until_ms)
    if until is not None:
        text += f" until {until.isoformat()}"
    return text


def cancelled_reason(by: str) -> str:
    """The reason of the skip record a cancelled run request leaves under its key:
    ``cancelled by alice@web-1``."""
    return f"{CANCELLED_BY}{by}"


def active_pause(pauses: Sequence[Pause], job: str, trigger: str, now_ms: int) -> Pause | None:
    """The pause that holds a claim of ``job`` by ``trigger`` at ``now_ms``: the job's own pause,
    else a whole-cluster one; None if none holds or the trigger is not paused (manual runs)."""
    if trigger not in PAUSED_TRIGGERS:
        return None
    for name in (job, ALL_JOBS):
        for pause in pauses:
            if pause.job == name and pause.active(now_ms):
                return pause
    return None


def retry_key(slot_key: str, retry: int) -> str:
    """The slot key of the ``retry``-th retry of the run under ``slot_key``:
    ``<slot_key>-retry-<n>`` (a retry of a retry keeps the first key)."""
    base = slot_key.split("-retry-", 1)[0]
    return f"{base}-retry-{retry}"


@dataclass(frozen=True, slots=True, kw_only=True)
class RunRequest(_Stored):
    """A request that the cluster run ``job`` once: a manual trigger or a retry."""

    id: str
    """Unique; it is the run id of the run it starts (32 hex digits)."""
    job: str
    """The job's name."""
    trigger: Trigger
    """:attr:`~anarchon.Trigger.MANUAL` or :attr:`~anarchon.Trigger.RETRY`."""
    key: str
    """The slot key the run is claimed under: ``manual-<id>`` for a trigger,
    :func:`retry_key` for a retry."""
    slot: int | None
    """The slot a retry runs again; None for a manual run."""
    due_ms: int
    """Not run before this (backend clock): the retry's backoff; a trigger's is its request."""
    requested_by: str
    """Who asked: a trigger's ``by`` (``user@host`` by default), or
    ``retry <n> of <m> after run <id>`` for a retry."""
    requested_at_ms: int
    """When it was asked (backend clock, epoch ms)."""
    retry: int = 0
    """The retry's number (1 for the first retry); 0 for a manual run."""

    @property
    def kind(self) -> str:
        """What operators call it: ``trigger`` (a manual run) or ``retry``."""
        return "retry" if self.trigger is Trigger.RETRY else "trigger"

    def to_dict(self) -> dict[str, Any]:
        """The fields by name as plain values (the trigger as its text)."""
        return {**asdict(self), "trigger": str(self.trigger)}


@runtime_checkable
class ControlStore(Protocol):
    """Where a backend keeps pauses and run requests.

    Implementations run on their backend's connection (started by its ``start``), create their
    storage with the backend's own (a read of a store that was never written answers empty,
    without creating anything), and raise :class:`~anarchon.errors.BackendUnavailable` for
    transient faults. Lease backends read the same pauses inside :meth:`~anarchon.backend.
    Backend.claim` (see :func:`active_pause`); a backend that cannot do that atomically says so
    in its documentation.
    """

    async def pause(self, pause: Pause) -> None:
        """Store ``pause``, replacing any pause of the same job."""

    async def resume(self, job: str) -> Pause | None:
        """Remove the pause of ``job`` (or :data:`ALL_JOBS`); return it, or None if there was
        none."""

    async def pauses(self) -> list[Pause]:
        """Every stored pause, expired ones included (any order)."""

    async def request(self, request: RunRequest) -> bool:
        """Store ``request`` unless one with its id exists; True if stored (idempotent)."""

    async def requests(self, jobs: Sequence[str] | None = None) -> list[RunRequest]:
        """The stored requests of ``jobs`` (None: of every job), due first."""

    async def done(self, request_id: str) -> None:
        """Remove a request (its claim was decided); no error if it is absent."""
