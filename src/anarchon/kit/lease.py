"""The lease rules, written once: fences, pruning, overlap, the answers to every lease call.

Backends that run the rules in Python (memory, SQLite) call these functions inside one atomic
step over a :class:`RowStore`; backends that run them in their own language (Lua, SQL) use
:class:`RunRow` and the helpers that build outcomes and errors. See
:mod:`anarchon.backends._lease_rules` for the rules in prose.
"""

from __future__ import annotations

from ..backends._lease_rules import (
    HANDED_OVER,
    LEASE_LOST,
    MAX_ATTEMPTS,
    MAX_MS,
    PRUNE_BATCH,
    PRUNED_REASON,
    RowStore,
    RunRow,
    already_recorded,
    answer_existing,
    check_ticket,
    claim,
    finish,
    lease_lost,
    next_fence,
    peek_takeover,
    pruned_outcome,
    refused_outcome,
    release,
    renew,
    take_over,
    ttl_cutoff,
    unstorable,
)

__all__ = [
    "HANDED_OVER",
    "LEASE_LOST",
    "MAX_ATTEMPTS",
    "MAX_MS",
    "PRUNED_REASON",
    "PRUNE_BATCH",
    "RowStore",
    "RunRow",
    "already_recorded",
    "answer_existing",
    "check_ticket",
    "claim",
    "finish",
    "lease_lost",
    "next_fence",
    "peek_takeover",
    "pruned_outcome",
    "refused_outcome",
    "release",
    "renew",
    "take_over",
    "ttl_cutoff",
    "unstorable",
]
