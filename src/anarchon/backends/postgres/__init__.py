"""PostgreSQL: claims, leases and history in eight tables, for instances on any number of hosts.

Every decision is taken by the database, on its clock (``clock_timestamp()``): a batch of
claims is one short transaction sent in one round trip (lock the jobs' rows, then one statement
decides every request), and a renewal, takeover, release or result is one statement. Tables are
created on start by versioned migrations under an advisory lock. Backups hear of hand-overs and
results by LISTEN/NOTIFY on a dedicated connection, and poll at lease expiry if a notification
is lost.

The claim path: ``PostgresBackend.claim`` in ``_backend.py`` (the contract's methods), the
``lock_jobs`` and ``claim`` statements in ``queries.sql``, and ``claim_outcome`` in
``_rows.py``. The other files: ``_connection.py`` (pool, liveness, bounded call),
``_attempts.py`` (the pool's connection class: why its last connection attempt failed),
``_statements.py`` (sending a statement, reading its rows), ``_transactions.py`` (one
transaction, or many in one round trip, a failing item failing alone), ``_errors.py`` (driver
errors), ``_options.py`` (options, URLs), ``_queries.py`` (composing ``queries.sql``),
``_migrations.py`` (table versions), ``_listener.py`` (LISTEN), ``_registry.py`` (the instance
registry and definitions sets) and ``_control.py`` (pauses and run requests).

psycopg 3 and psycopg_pool are imported when a :class:`PostgresBackend` is built, so the rest of
anarchon works without them (``pip install 'anarchon[postgres]'``).
"""

from __future__ import annotations

from ._backend import PostgresBackend
from ._control import PostgresControl
from ._registry import PostgresRegistry

__all__ = ["PostgresBackend", "PostgresControl", "PostgresRegistry"]
