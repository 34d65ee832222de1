"""Loaded only by processes the fault suite runs under libfaketime (this folder is put on their
``PYTHONPATH``; nothing else imports it).

Debian's libfaketime 0.9.10 with ``FAKETIME_DONT_FAKE_MONOTONIC=1`` breaks ``time.sleep`` on
Python 3.11+: it sleeps with ``clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME)``, which the
library mishandles (EINVAL; upstream issue 426). Waiting on a ``threading.Event`` with a timeout
takes another path (a semaphore or condition timed on the monotonic clock) and works, so
``time.sleep`` is replaced by that. asyncio's sleeps (epoll timeouts) are not affected.
"""

from __future__ import annotations

import operator
import threading
import time
from typing import SupportsIndex


def _sleep(seconds: float | SupportsIndex) -> None:
    value = seconds if isinstance(seconds, float) else float(operator.index(seconds))
    if value < 0:
        raise ValueError("sleep length must be non-negative")
    threading.Event().wait(value)


time.sleep = _sleep
