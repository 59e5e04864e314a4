"""A booking's usage so far, for its page (a part registered in ``AccountingConfig.ready``).

The same figures as the usage report (accounting/report.py), for one booking: booked GPU-hours up to
now (approved time only, a released booking until its release), used and unmeasured GPU-hours from the
rolled-up ``UsageHour`` rows, the efficiency over the time that could be judged, and the energy its GPUs used
(kWh, and of that in idle minutes).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.conf import settings
from django.db.models import Max, Sum

from accounting.models import UsageHour
from accounting.report import ENERGY_TOTALS, SHARE, energy_figures, share_of
from accounting.tariffs import usage_cost
from reservations.models import Reservation


def reservation_usage(*, reservation: Reservation, viewer: Any, now: datetime) -> dict[str, Any] | None:
    """The usage part's context, or None (no part) for a booking cancelled or rejected before any use.
    Rows exist only for approved time that has begun. GPU-hours count a MIG slice by its share of its card."""
    hours = UsageHour.objects.filter(reservation=reservation)
    totals = hours.aggregate(
        reported=Sum("minutes_reported"),
        measured=Sum("minutes_measured"),
        utilization_sum=Sum("utilization_sum"),
        utilization_samples=Sum("utilization_samples"),
        peak_mib=Max("memory_used_max_mib"),
        last_hour=Max("hour"),
        **ENERGY_TOTALS,
    )
    if not totals["reported"] and reservation.status in (Reservation.Status.CANCELLED, Reservation.Status.REJECTED):
        return None
    used = unmeasured = reported = 0.0
    per_share = hours.values(**SHARE)
    for per_unit in per_share.annotate(
        used=Sum("used_minutes"), reported=Sum("minutes_reported"), measured=Sum("minutes_measured")
    ):
        share = share_of(per_unit) / 60
        used += per_unit["used"] * share
        reported += per_unit["reported"] * share
        unmeasured += (per_unit["reported"] - per_unit["measured"]) * share
    booked = 0.0
    if reservation.status == Reservation.Status.APPROVED:
        for allocation in reservation.allocations.select_related("gpu__parent"):
            if allocation.active:
                seconds = max(0.0, (min(allocation.end, now) - allocation.start).total_seconds())
                booked += seconds / 3600 * float(allocation.gpu.share_of(allocation.gpu.parent))
    energy_kwh, idle_energy_kwh, energy_estimated = energy_figures(totals)
    samples = totals["utilization_samples"] or 0
    judged = booked - unmeasured
    return {
        "has_usage": bool(totals["reported"]),
        "measured": bool(totals["measured"]),
        "booked_gpu_hours": booked,
        "used_gpu_hours": used,
        "unmeasured_gpu_hours": unmeasured,
        "reported_gpu_hours": reported,
        "efficiency": min(1.0, used / judged) if judged > 0 else None,
        "mean_utilization_pct": totals["utilization_sum"] / samples if samples else None,
        "peak_memory_gb": None if totals["peak_mib"] is None else totals["peak_mib"] / 1024,
        "energy_kwh": energy_kwh,
        "idle_energy_kwh": idle_energy_kwh or 0.0,
        "energy_estimated": energy_estimated,
        "cost": usage_cost(hours),
        "currency": settings.TARIFF_CURRENCY,
        "last_hour": totals["last_hour"],
        "threshold_pct": settings.USAGE_USED_THRESHOLD_PCT,
        "rollup_minutes": max(1, round(settings.USAGE_ROLLUP_SECONDS / 60)),
        "started": reservation.start <= now,
    }
