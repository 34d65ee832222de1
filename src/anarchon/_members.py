"""The enum members the per-slot paths and the lease rules (:mod:`anarchon.kit.lease`) compare
with, read once here as module constants.

On Python 3.11 ``Enum.MEMBER`` goes through EnumType's ``__getattr__`` hook: about 1 000
instructions (0.15-0.2 us) a read, and a burst reads these thousands of times. A module constant
is one global lookup.

Each constant is named as its member, with a prefix where the bare name would be ambiguous or
read as something else: ``CLAIM_SKIPPED`` is ``ClaimStatus.SKIPPED`` (``SKIPPED`` the run
status), ``OVERLAP_SKIP`` is ``Overlap.SKIP`` and ``CAUSE_*`` are skip causes.
"""

from __future__ import annotations

from typing import Final

from ._models import Kind, Overlap, RunStatus, SkipCause, Trigger
from .backend import ClaimStatus

__all__ = [
    "BACKUP",
    "CAUSE_OVERLAP",
    "CAUSE_PAUSED",
    "CLAIM_SKIPPED",
    "LOST",
    "OVERLAP_SKIP",
    "PREFERRED",
    "RUNNING",
    "SCHEDULE",
    "SKIPPED",
    "UNRANKED",
    "WON",
]

SCHEDULE: Final = Trigger.SCHEDULE
RUNNING: Final = RunStatus.RUNNING
SKIPPED: Final = RunStatus.SKIPPED
WON: Final = ClaimStatus.WON
LOST: Final = ClaimStatus.LOST
CLAIM_SKIPPED: Final = ClaimStatus.SKIPPED
PREFERRED: Final = Kind.PREFERRED
BACKUP: Final = Kind.BACKUP
UNRANKED: Final = Kind.UNRANKED
OVERLAP_SKIP: Final = Overlap.SKIP
CAUSE_PAUSED: Final = SkipCause.PAUSED
CAUSE_OVERLAP: Final = SkipCause.OVERLAP
