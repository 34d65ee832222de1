"""The backend kit: what a backend may use besides :mod:`anarchon.backend` and
:mod:`anarchon.errors`.

A backend (in this repository or outside it) imports the contract from :mod:`anarchon.backend`,
the errors from :mod:`anarchon.errors`, and its plumbing from here: name checks, option checks,
backoff, time conversion, URL redaction, the lease rules (:mod:`anarchon.kit.lease`) and named
SQL queries (:mod:`anarchon.kit.sql`). It never imports the core's private modules; a test
(``tests/unit/test_import_boundary.py``) fails when one does.
"""

from __future__ import annotations

from .._clock import Clock, SystemClock
from .._job import check_name
from .._models import Overlap, Run, RunStatus, Trigger, ms_to_datetime
from .._options import HISTORY_SIZE, Bound, check_bool, check_int, ms_text
from .._redact import redact_url
from .._retry import backoff

__all__ = [
    "HISTORY_SIZE",
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
    "check_name",
    "ms_text",
    "ms_to_datetime",
    "redact_url",
]
