"""The enum members the per-slot paths compare with, read once here as module constants.

On Python 3.11 ``Enum.MEMBER`` goes through EnumType's ``__getattr__`` hook: about 1 000
instructions (0.15-0.2 us) a read, and a burst reads these thousands of times. A module constant
is one global lookup.
"""

from __future__ import annotations

from typing import Final

from ._models import Kind, RunStatus, Trigger
from .backend import ClaimStatus

__all__ = ["BACKUP", "PREFERRED", "RUNNING", "SCHEDULE", "UNRANKED", "WON"]

SCHEDULE: Final = Trigger.SCHEDULE
RUNNING: Final = RunStatus.RUNNING
WON: Final = ClaimStatus.WON
PREFERRED: Final = Kind.PREFERRED
BACKUP: Final = Kind.BACKUP
UNRANKED: Final = Kind.UNRANKED
