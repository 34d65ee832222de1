"""Which slots to catch up on start: those missed while no instance ran."""

from __future__ import annotations

from ._models import CatchUp
from ._schedule import CronSchedule

__all__ = ["missed_slots"]


def missed_slots(
    schedule: CronSchedule, last_slot: int | None, now_ms: int, window_ms: int, mode: CatchUp
) -> tuple[list[int], int]:
    """Return (slots to claim, how many missed slots are left out) for a job starting at ``now_ms``.

    Missed slots are those after the job's last recorded slot, not in the future, and inside the
    window. A job without history (``last_slot`` None) has nothing to catch up. ``latest`` keeps
    only the newest missed slot; ``all`` keeps them all, oldest first.
    """
    if mode is CatchUp.NONE or last_slot is None:
        return [], 0
    since = max(last_slot, now_ms - window_ms)
    missed = schedule.slots(since, now_ms)
    if mode is CatchUp.LATEST and len(missed) > 1:
        return missed[-1:], len(missed) - 1
    return missed, 0
