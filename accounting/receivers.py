"""How accounting reacts: the jobs of Slurm reservations were read (slurm/signals.py), so the usage of their
bookings is counted again from them."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.dispatch import receiver

from accounting.slurm_usage import slurm_usage_rollup
from slurm.signals import jobs_read


@receiver(jobs_read.in_transaction)
def slurm_jobs_read(sender: type, reservation_ids: list[int], now: datetime, **kwargs: Any) -> None:
    slurm_usage_rollup(reservation_ids=reservation_ids, now=now)
