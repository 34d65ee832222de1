"""Rank delays: which instance claims a slot first, so a healthy fleet makes one claim per slot.

Each slot ``<job>:<slot>`` gets an order of the live instances that carry the job, by rendezvous
(highest random weight) hashing over the registry's view (:mod:`._heartbeat` feeds it): the
instance ranked first claims at the slot, the next ones only after a delay by rank, and an
instance that hears (:meth:`anarchon.backend.Backend.subscribe_claims`) that the slot was won
before its delay is over does not claim at all. The claim still decides: a stale view, a lost
notice or two instances that disagree on the ranking cost a losing claim, never a second run.

Without a view, alone, without jitter, or on a backend that announces no claims, an instance
waits a random delay in ``[0, jitter_ms]`` as it always did (the claim is then ``unranked``).
"""

from __future__ import annotations

import functools
import hashlib
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final, NamedTuple

from ._members import BACKUP, PREFERRED, UNRANKED
from ._models import Kind
from .backend import ClaimNotice
from .registry import SILENT_HEARTBEATS, ClusterView

__all__ = ["Kind", "Plan", "Rendezvous", "delay_for_rank", "rank", "score"]

#: Records whose heartbeat is older than this many of their own heartbeats are not ranked: the
#: instance may be dead, and ranking it first would cost each of its slots a rank delay.
FRESH_HEARTBEATS: Final = 3
#: Ranks past this one all wait the whole jitter.
LAST_RANK: Final = 4

_MASK: Final = (1 << 64) - 1


def _mix(value: int) -> int:
    """splitmix64's finaliser: spreads every input bit over the 64 output bits."""
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK
    return value ^ (value >> 31)


@functools.lru_cache(maxsize=4096)
def _digest(text: str) -> int:
    """64 bits of BLAKE2b of ``text``: the same on every host and Python version (no
    ``hash()``, which is salted per process)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


def score(instance: str, key: str) -> int:
    """The 64-bit weight of ``instance`` for the slot ``key`` (``<job>:<slot>``): the two
    digests mixed, so ranking N instances costs two digests and N mixes."""
    return _mix(_digest(instance) ^ _slot_weight(key))


def _slot_weight(key: str) -> int:
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return _mix((int.from_bytes(digest, "big") + 1) & _MASK)


def rank(instance: str, carriers: Sequence[str], key: str) -> int | None:
    """``instance``'s rank (0: first) for ``key`` among ``carriers``; None if it is not one.
    Ties (equal weights) go to the greater id, so every instance agrees on one order."""
    if instance not in carriers:
        return None
    slot = _slot_weight(key)
    mine = (_mix(_digest(instance) ^ slot), instance)
    return sum(1 for other in carriers if (_mix(_digest(other) ^ slot), other) > mine)


def _uniform(high: int) -> int:
    """A random integer in ``[0, high]``, each equally likely (as ``random.randint(0, high)``,
    at a tenth of its cost: a scheduler starting with 100 000 jobs draws one per job)."""
    return int(random.random() * (high + 1))


def delay_for_rank(position: int, jitter_ms: int) -> int:
    """How long after the slot the instance of rank ``position`` claims: at once for rank 0,
    then half the jitter, three quarters, seven eighths, and the whole jitter from rank 4 on."""
    if position <= 0:
        return 0
    if position >= LAST_RANK:
        return jitter_ms
    return jitter_ms - (jitter_ms >> position)


class Plan(NamedTuple):
    """When to claim a slot (ms after it) and why. A tuple: one is made for every slot a
    scheduler arms (100 000 at the start of one with 100 000 jobs), and a frozen dataclass
    took three times as long to make."""

    delay_ms: int
    kind: Kind


@dataclass(frozen=True, slots=True)
class _Group:
    """Instances that carry the same set of jobs (usually the whole fleet is one group)."""

    jobs: frozenset[str]
    ids: tuple[str, ...]


class Rendezvous:
    """Plans the claims of one instance from the latest registry view, and keeps the notices
    heard for the slots it is waiting on.

    :param instance: this instance's id (set again when the scheduler starts).
    :param monotonic_ms: the clock the age of the view is measured on.
    """

    def __init__(self, instance: str, monotonic_ms: Callable[[], int]) -> None:
        self.instance = instance
        self.notices = False
        """True once the backend said it announces claims (only then are claims ranked)."""
        self._monotonic_ms = monotonic_ms
        self._groups: tuple[_Group, ...] = ()
        # The job names of each definitions set (by digest) in the last view: a fleet of 100 000
        # jobs per instance would otherwise build them again at every view (80 ms each).
        self._job_sets: dict[str, frozenset[str]] = {}
        self._seen_at: int | None = None
        self._max_age_ms = 0
        # job -> the slot this instance waits to claim; job -> the notice heard for it.
        self._pending: dict[str, tuple[int, Kind]] = {}
        self._heard: dict[str, ClaimNotice] = {}

    def see(self, view: ClusterView) -> None:
        """Take a fresh registry view: rank only instances that beat within
        :data:`FRESH_HEARTBEATS` of their heartbeats before it was read."""
        groups: dict[frozenset[str], list[str]] = {}
        known, self._job_sets = self._job_sets, {}
        max_interval = 0
        for record in view.instances:
            if view.now_ms - record.heartbeat_ms > FRESH_HEARTBEATS * record.interval_ms:
                continue
            if record.id == self.instance:
                max_interval = max(max_interval, record.interval_ms)
            digest = record.definitions
            names = None
            if digest is not None:
                names = self._job_sets.get(digest) or known.get(digest)
            if names is None:
                names = frozenset(d.name for d in record.jobs)
            if digest is not None and (names or not record.job_count):
                self._job_sets[digest] = names  # not a set whose definitions were missing
            groups.setdefault(names, []).append(record.id)
        self._groups = tuple(_Group(k, tuple(v)) for k, v in groups.items())
        self._seen_at = self._monotonic_ms()
        # Ranking by a view this instance read long ago (its heartbeat failing, its loop
        # overloaded) would be a guess: past the registry's silent window, claim unranked.
        self._max_age_ms = SILENT_HEARTBEATS * max_interval

    def forget(self) -> None:
        """Drop the view and what was heard (the scheduler stopped)."""
        self._groups = ()
        self._job_sets = {}
        self._seen_at = None
        self._pending.clear()
        self._heard.clear()

    def carriers(self, job: str) -> list[str]:
        """The ranked instances that carry ``job`` in the last view (empty when it is stale)."""
        if self._seen_at is None or self._monotonic_ms() - self._seen_at > self._max_age_ms:
            return []
        return [i for g in self._groups if job in g.jobs for i in g.ids]

    def share(self, job: str) -> tuple[int, int] | None:
        """This instance's position among the ranked carriers of ``job`` (by id) and how many
        they are; None when it is alone or not one of them (no view, a stale one)."""
        carriers = sorted(self.carriers(job))
        if len(carriers) < 2 or self.instance not in carriers:
            return None
        return carriers.index(self.instance), len(carriers)

    def plan(self, job: str, slot: int, jitter_ms: int) -> Plan:
        """When this instance claims ``job``'s ``slot``, remembered as the slot it waits on."""
        self._heard.pop(job, None)
        carriers = self.carriers(job) if self.notices and jitter_ms > 0 else []
        position = rank(self.instance, carriers, f"{job}:{slot}") if len(carriers) > 1 else None
        if position is None:
            plan = Plan(_uniform(jitter_ms) if jitter_ms else 0, UNRANKED)
        else:
            kind = PREFERRED if position == 0 else BACKUP
            plan = Plan(delay_for_rank(position, jitter_ms), kind)
        self._pending[job] = (slot, plan.kind)
        return plan

    def hear(self, notices: Sequence[ClaimNotice]) -> list[ClaimNotice]:
        """Note the notices of slots this instance still waits on (another instance won them);
        return those, each once."""
        heard: list[ClaimNotice] = []
        for notice in notices:
            if notice.instance == self.instance or notice.job in self._heard:
                continue
            pending = self._pending.get(notice.job)
            if pending is None or notice.slot_key != str(pending[0]):
                continue
            self._heard[notice.job] = notice
            heard.append(notice)
        return heard

    def due(self, job: str, slot: int) -> tuple[Kind, ClaimNotice | None]:
        """The slot is due here: stop waiting on it. Returns how it was planned and the notice
        heard for it, if any (then do not claim: another instance won it)."""
        kind = UNRANKED
        pending = self._pending.get(job)
        if pending is not None and pending[0] == slot:
            kind = pending[1]
            del self._pending[job]
        notice = self._heard.get(job)
        if notice is not None and notice.slot_key == str(slot):
            del self._heard[job]
            return kind, notice
        return kind, None
