"""The backend kit: what a backend may use besides :mod:`anarchon.backend` and
:mod:`anarchon.errors`.

A backend (in this repository or outside it) imports the contract from :mod:`anarchon.backend`,
the errors from :mod:`anarchon.errors`, and its plumbing from here: name checks, option checks,
backoff, time conversion, URL redaction, fast makers of slotted records (:func:`maker`), the
outage log actions and the one builder of a log record's fields (:func:`log_fields`, with
:class:`Action`: a record about a slot gets ``slot_iso`` beside ``slot``) here, and in
submodules:

* :mod:`anarchon.kit.checks`: names checked by pattern (:func:`check_pattern`);
* :mod:`anarchon.kit.lease`: the lease rules, written once (fences, pruning, overlap, answers);
* :mod:`anarchon.kit.calls`: one bounded call and one retry loop on anarchon's backoff;
* :mod:`anarchon.kit.urls`: the URL redactor and the one splitter of URL options;
* :mod:`anarchon.kit.feed`: the change feed (listeners, isolated dispatch, supervised loop);
* :mod:`anarchon.kit.migrations`: the migration runner of SQL backends;
* :mod:`anarchon.kit.sql`: named SQL queries from a ``queries.sql`` file.

A backend never imports the core's private modules; ``tests/unit/test_import_boundary.py``
fails when one does.
"""

from __future__ import annotations

from typing import Final

from .._clock import Clock, SystemClock
from .._frozen import maker
from .._job import check_name
from .._models import Overlap, Run, RunStatus, Trigger, ms_to_datetime
from .._options import HISTORY_SIZE, Bound, check_bool, check_int, check_keywords, ms_text
from .._redact import redact_url
from .._retry import backoff
from ..logs import Action, log_fields
from .checks import check_pattern

BACKEND_UNAVAILABLE: Final = Action.BACKEND_UNAVAILABLE
"""Log action: calls to the backend started failing (logged once per outage)."""
BACKEND_RECOVERED: Final = Action.BACKEND_RECOVERED
"""Log action: the backend answers again after :data:`BACKEND_UNAVAILABLE`."""
NOTIFICATIONS_LOST: Final = Action.NOTIFICATIONS_LOST
"""Log action: the backend's change notifications stopped (backups fall back to lease expiry)."""
NOTIFICATIONS_RESUMED: Final = Action.NOTIFICATIONS_RESUMED
"""Log action: change notifications flow again after :data:`NOTIFICATIONS_LOST`."""
OUTAGE_ACTIONS: Final = (
    BACKEND_UNAVAILABLE,
    BACKEND_RECOVERED,
    NOTIFICATIONS_LOST,
    NOTIFICATIONS_RESUMED,
)
"""The ``action`` field of every backend's outage log records, the same for every backend."""

__all__ = [
    "BACKEND_RECOVERED",
    "BACKEND_UNAVAILABLE",
    "HISTORY_SIZE",
    "NOTIFICATIONS_LOST",
    "NOTIFICATIONS_RESUMED",
    "OUTAGE_ACTIONS",
    "Action",
    "Bound",
    "Clock",
    "Overlap",
    "Run",
    "RunStatus",
    "SystemClock",
    "Trigger",
    "backoff",
    "check_bool",
    "check_int",
    "check_keywords",
    "check_name",
    "check_pattern",
    "log_fields",
    "maker",
    "ms_text",
    "ms_to_datetime",
    "redact_url",
]
