"""What the example's jobs write: one row per run."""

from __future__ import annotations

from django.db import models


class Tick(models.Model):
    """One run of a job, written by the job itself."""

    job = models.CharField(max_length=64)
    slot = models.DateTimeField()
    instance = models.CharField(max_length=256)
    fence = models.BigIntegerField()
