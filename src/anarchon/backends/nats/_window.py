"""The stream's duplicate window while the backend runs: what each job needs of it, what the
stream really has, and keeping it at least that long.

The window is the stream's, shared by every instance: each instance grows it to its own
``duplicate_window_ms`` in ``start()`` (see :mod:`._stream`) and checks its jobs against the
window the stream really has, which other instances may have grown further.
"""

from __future__ import annotations

import logging
from typing import Any

from ...backend import JobPolicy
from ...errors import InvalidOption
from ...kit import Action, log_fields
from . import _errors as errors
from . import _stream as stream_setup
from . import _timings as timings
from ._connection import Connection
from ._errors import JetStreamError

logger = logging.getLogger("anarchon.backends.nats")


class Window:
    """What this instance's jobs need of the stream's duplicate window, and what it is."""

    def __init__(self, connection: Connection, *, stream: str, duplicate_window_ms: int) -> None:
        self._connection = connection
        self._stream = stream
        self._least_ms = duplicate_window_ms
        # The stream's real duplicate window once known (start()), and what each job added so
        # far needs of it (jitter_ms + max_late_ms + CLAIM_MARGIN_MS).
        self._stream_ms: int | None = None
        self._needs: dict[str, int] = {}
        self._max_late: dict[str, int] = {}

    @staticmethod
    def need_ms(policy: JobPolicy) -> int:
        """How long the stream must remember a slot's claim for this job."""
        return policy.jitter_ms + policy.max_late_ms + timings.CLAIM_MARGIN_MS

    @property
    def ms(self) -> int:
        """The stream's window once started, this instance's ``duplicate_window_ms`` before."""
        return self._stream_ms if self._stream_ms is not None else self._least_ms

    def max_late_ms(self, job: str) -> int:
        """``max_late_ms`` of ``job`` as added (half the window for a job not added here)."""
        return self._max_late.get(job, self.ms // 2)

    def safe_until_ms(self, slot: int, margin_ms: int) -> int:
        """Until when a message under the slot's claim id is surely still de-duplicated."""
        window = self.ms
        return slot + window - min(margin_ms, window // 4)

    def learn(self, info: dict[str, Any]) -> None:
        """Take the window from a stream info answer."""
        self._stream_ms = stream_setup.window_ms(info)

    def check_job(self, policy: JobPolicy) -> None:
        """Require ``jitter_ms + max_late_ms + CLAIM_MARGIN_MS <`` the window, and remember it."""
        need = self.need_ms(policy)
        if need >= self.ms:
            margin = timings.CLAIM_MARGIN_MS
            raise InvalidOption(
                f"job {policy.name!r}: jitter_ms + max_late_ms + {margin} ms of claim "
                f"retries = {policy.jitter_ms} + {policy.max_late_ms} + {margin} = "
                f"{need} must be less than {self._text()}: outside that window "
                "JetStream no longer recognises a repeated claim and a very late instance could "
                f"run the slot again. Lower max_late_ms or jitter_ms, or {self._fix(need)}"
            )
        self._needs[policy.name] = need
        self._max_late[policy.name] = policy.max_late_ms

    def _text(self) -> str:
        if self._stream_ms is None:
            return (
                f"this NATS backend's duplicate_window_ms={self._least_ms} (the least "
                f"window it keeps on stream {self._stream!r})"
            )
        return (
            f"the duplicate window of stream {self._stream!r}, {self._stream_ms} ms as the stream "
            "has it now (anarchon grows it to the largest duplicate_window_ms of the instances "
            "that started, and never shrinks it)"
        )

    def _fix(self, need: int) -> str:
        if self._stream_ms is None:
            return f"raise duplicate_window_ms above {need}"
        return f"raise duplicate_window_ms above {need} and restart this instance"

    def skew_budget_ms(self, policy: JobPolicy) -> int:
        """The window less ``jitter_ms + max_late_ms + CLAIM_MARGIN_MS``."""
        return self.ms - self.need_ms(policy)

    async def check(self) -> int | None:
        """Read the stream's window now and return it (None: the stream is gone); raise it back
        if it fell below what this instance keeps, with a warning naming the job (and the
        stream's max_age, raised too when it was below the window)."""
        self._connection.require()
        try:
            info = await self._connection.stream_info()
        except JetStreamError as exc:
            if exc.err_code != errors.STREAM_NOT_FOUND:
                raise
            return None  # the guard says so, and makes it again (see _guard)
        window = stream_setup.window_ms(info)
        need, job = max(((n, j) for j, n in self._needs.items()), default=(0, "-"))
        target = max(self._least_ms, need + 1)
        if window < target:
            window = await self._restore(info, window, target, job, need)
        self._stream_ms = window
        return window

    async def _restore(
        self, info: dict[str, Any], window: int, target: int, job: str, need: int
    ) -> int:
        """Raise the stream's window (and its max_age, if shorter) back to ``target``; the
        window the stream has afterwards. Each outcome is a WARNING: a window below what the
        jobs need lets a late instance run a slot again."""
        max_age = stream_setup.max_age_ms(info)
        try:
            raised = await stream_setup.raise_window(self._connection.api, self._stream, target)
        except Exception as exc:
            logger.warning(
                "the duplicate window of stream %s is %d ms, less than this instance keeps "
                "(duplicate_window_ms=%d; job %s needs %d ms), and raising it back to %d ms "
                "failed: %s. The stream's max_age is %s. Until the window is at least %d ms a "
                "late or retried claim may not be recognised and a slot may run twice: set the "
                "stream's duplicate_window (and max_age, if shorter) back to at least that",
                self._stream,
                window,
                self._least_ms,
                job,
                need,
                target,
                self._connection.scrub(errors.describe(exc)),
                f"{max_age} ms" if max_age else "unlimited",
                target,
                extra=log_fields(Action.WINDOW_RAISE_FAILED, job, stream=self._stream),
            )
            return window
        now = stream_setup.window_ms(raised)
        age_now = stream_setup.max_age_ms(raised)
        age_text = (
            f"; its max_age was {max_age} ms, shorter than the window, and is now {age_now} ms"
            if age_now != max_age
            else ""
        )
        logger.warning(
            "the duplicate window of stream %s was %d ms, less than this instance keeps "
            "(duplicate_window_ms=%d; job %s needs %d ms); raised it to %d ms%s. Another "
            "instance shrank it (shrink_window=True) or the stream was changed by hand",
            self._stream,
            window,
            self._least_ms,
            job,
            need,
            now,
            age_text,
            extra=log_fields(Action.WINDOW_RAISED, job, stream=self._stream),
        )
        return now
