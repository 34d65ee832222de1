"""Every Redis key and channel the Redis backend uses, and the rule for prefixes.

Per job ``J`` under prefix ``P`` (default ``anarchon:``), five keys, all carrying the hash tag
``{J}`` so that they live in one Redis Cluster slot and one script may touch them together:

=====================  =====  =============================================================
key                    type   contents
=====================  =====  =============================================================
``P{J}:meta``          hash   ``fence`` (last fencing token), ``seq`` (last attempt id),
                              ``last_slot`` (newest scheduled or catch-up slot),
                              ``pruned_through`` (newest slot pruning removed),
                              ``known_from`` (slots before this are unknown to this data set)
``P{J}:runs``          hash   attempt id (12 digits, rising) -> the attempt as JSON
``P{J}:slots``         hash   slot key (``<epoch ms>`` or ``manual-<run id>``) -> current attempt id
``P{J}:order``         zset   attempt id scored by its start (ms): history, newest first
``P{J}:leases``        zset   attempt id of every attempt still running, scored by its lease
                              expiry (ms; a released one by its release): overlap checks
                              (leases that end after now), open runs (all of them)
=====================  =====  =============================================================

Pauses and run requests (:mod:`._control`), two keys per prefix with the hash tag ``{control}``:

=====================  =====  =============================================================
``P{control}:pauses``  hash   job name or ``*`` -> the pause as JSON, with its rendered reason
``P{control}:requests`` hash  request id -> the run request as JSON
=====================  =====  =============================================================

The claim script reads ``P{control}:pauses`` as its sixth key, except on a Redis Cluster, where
a job's slot is not the pauses' slot (see ``docs/backends/redis.md``). No job's keys collide with
them: a job's keys end in ``:meta``, ``:runs``, ``:slots``, ``:order`` or ``:leases``.

One channel per prefix, ``P_changes`` (no job: PUBLISH reaches every node of a cluster),
carries ``["<job>", "<slot key>", <released>]`` when an attempt is released (true) or
finishes (false), from the script; the finishes of a batch of several results come instead as
one JSON list of such triples (at most 500 to a message), published by the caller after the
batch. A second one, ``P_claims``, carries ``["<job>", "<slot key>", "<instance>", <lease
expiry ms>]`` when a claim is won (claim notices: see ``Backend.subscribe_claims``), from the
claim script; for a batch of several claims, one JSON list of them published after it.

A prefix has no ``{`` (the first ``{`` of every key opens its hash tag, so no prefix can reach
into another's keys), no glob characters (``<prefix>{*`` is exactly one namespace for SCAN), no
whitespace, and ends with ``:``.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Final, NamedTuple

from ...errors import InvalidOption
from ...kit import check_name

__all__ = ["ControlKeys", "JobKeys", "Namespace", "check_prefix"]

DEFAULT_PREFIX: Final = "anarchon:"
PREFIX_RULE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,98}:")
PREFIX_RULE_TEXT: Final = (
    "1 to 100 characters of letters, digits, '_', '-', '.' and ':', starting with a letter or "
    "digit and ending with ':' (no braces, spaces or glob characters, so that keys of two "
    "prefixes can never collide and every key of a job keeps its cluster hash tag)"
)


def check_prefix(prefix: object) -> str:
    """Return ``prefix`` if it follows the rule, else raise :class:`InvalidOption`."""
    if not isinstance(prefix, str) or not PREFIX_RULE.fullmatch(prefix):
        raise InvalidOption(f"Redis key prefix {prefix!r} must be {PREFIX_RULE_TEXT}")
    return prefix


class JobKeys(NamedTuple):
    """The keys of one job, in the order the scripts read them (``KEYS[1..5]``)."""

    meta: str
    runs: str
    slots: str
    order: str
    leases: str

    def all(self) -> list[str]:
        """The keys as the scripts' ``KEYS`` array."""
        return list(self)


KINDS: Final = JobKeys._fields
"""The kinds of a job's keys (the last part of each name), in the scripts' order."""


class ControlKeys(NamedTuple):
    """The keys of the pauses and run requests under one prefix."""

    pauses: str
    requests: str


# Every claim, renewal and result names its job's keys: made (and the name checked) once per
# job, for as many jobs as a large deployment carries.
@functools.lru_cache(maxsize=100_000)
def _job_keys(prefix: str, job: str) -> JobKeys:
    check_name(job)
    base = f"{prefix}{{{job}}}:"
    return JobKeys(*(base + kind for kind in KINDS))


@dataclass(frozen=True, slots=True)
class Namespace:
    """Key names under one validated prefix."""

    prefix: str

    def __post_init__(self) -> None:
        check_prefix(self.prefix)

    def job(self, job: str) -> JobKeys:
        """The keys of ``job``; raises :class:`~anarchon.errors.InvalidJobName` for a bad name,
        since a name with braces would break the hash tag."""
        return _job_keys(self.prefix, job)

    def meta(self, job: str) -> str:
        """``job(job).meta`` without making (and caching) the job's other keys: a scheduler
        starting with 100 000 jobs reads each job's META once, long before its first claim."""
        check_name(job)
        return f"{self.prefix}{{{job}}}:meta"

    @property
    def control(self) -> ControlKeys:
        """The keys of the pauses and run requests (one cluster slot: ``{control}``)."""
        base = f"{self.prefix}{{control}}:"
        return ControlKeys(pauses=base + "pauses", requests=base + "requests")

    @property
    def channel(self) -> str:
        """The pub/sub channel for releases and finishes."""
        return f"{self.prefix}_changes"

    @property
    def claims_channel(self) -> str:
        """The pub/sub channel for won claims (claim notices)."""
        return f"{self.prefix}_claims"

    @property
    def pattern(self) -> str:
        """A SCAN MATCH pattern for every key of this prefix and no other prefix."""
        return f"{self.prefix}{{*"

    @property
    def leases_pattern(self) -> str:
        """A SCAN MATCH pattern for every job's index of open attempts (``:leases``) under this
        prefix: a job has that key only while it has an open attempt."""
        return f"{self.prefix}{{*}}:leases"

    def job_of_leases(self, key: str) -> str | None:
        """The job whose ``:leases`` key ``key`` is (as :attr:`leases_pattern` finds it), or
        None if it is no such key of this prefix."""
        head, tail = f"{self.prefix}{{", "}:leases"
        if not key.startswith(head) or not key.endswith(tail):
            return None
        job = key[len(head) : -len(tail)]
        return job if job and "}" not in job else None
