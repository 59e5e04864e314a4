"""A booking's usage so far, for its page (a part registered in ``AccountingConfig.ready``).

The same figures as the usage report (accounting/report.py), for one booking: booked GPU-hours up to
now (approved time only, a released booking until its release), used GPU-hours from the rolled-up
``UsageHour`` rows, and their ratio, the efficiency.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.conf import settings
from django.db.models import Max, Sum

from accounting.models import UsageHour
from reservations.models import Reservation


def reservation_usage(*, reservation: Reservation, viewer: Any, now: datetime) -> dict[str, Any] | None:
    """The usage part's context, or None (no part) for a booking cancelled or rejected before any use.
    Rows exist only for approved time that has begun."""
    totals = UsageHour.objects.filter(reservation=reservation).aggregate(
        used=Sum("used_minutes"),
        reported=Sum("minutes_reported"),
        utilization_sum=Sum("utilization_sum"),
        utilization_samples=Sum("utilization_samples"),
        peak_mib=Max("memory_used_max_mib"),
        last_hour=Max("hour"),
    )
    if not totals["reported"] and reservation.status in (Reservation.Status.CANCELLED, Reservation.Status.REJECTED):
        return None
    booked_seconds = 0.0
    if reservation.status == Reservation.Status.APPROVED:
        for allocation in reservation.allocations.all():
            if allocation.active:
                booked_seconds += max(0.0, (min(allocation.end, now) - allocation.start).total_seconds())
    booked = booked_seconds / 3600
    used = (totals["used"] or 0) / 60
    samples = totals["utilization_samples"] or 0
    return {
        "has_usage": bool(totals["reported"]),
        "booked_gpu_hours": booked,
        "used_gpu_hours": used,
        "reported_gpu_hours": (totals["reported"] or 0) / 60,
        "efficiency": used / booked if booked else None,
        "mean_utilization_pct": totals["utilization_sum"] / samples if samples else None,
        "peak_memory_gb": None if totals["peak_mib"] is None else totals["peak_mib"] / 1024,
        "last_hour": totals["last_hour"],
        "threshold_pct": settings.USAGE_USED_THRESHOLD_PCT,
        "rollup_minutes": max(1, round(settings.USAGE_ROLLUP_SECONDS / 60)),
        "started": reservation.start <= now,
    }
