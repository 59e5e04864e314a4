"""Advice on a slot's length from the person's own history: how long their GPUs were busy (from telemetry,
rolled up in ``UsageHour``) in their last bookings of as many GPUs. Advice only: nothing is refused on it.

"Busy" is the booking's used minutes (mean utilisation at least USAGE_USED_THRESHOLD_PCT) per GPU. Only
bookings that ended and whose GPUs reported utilisation count: a booking nobody measured says nothing of how
long the work took.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Count, Q, Sum

from accounting.models import UsageHour
from reservations.models import Reservation
from reservations.timegrid import grid

HISTORY = 10  # the last this many bookings
ENOUGH = 3  # fewer than this says too little to advise on
FAR_LONGER = 2.0  # a request this many times the mean busy time is "far longer"


@dataclass(frozen=True)
class LengthAdvice:
    gpus: int
    bookings: int  # how many past bookings the figures come from
    mean_busy_hours: float | None
    mean_booked_hours: float | None

    @property
    def suggested_hours(self) -> float | None:
        """The mean busy time, rounded up to the booking grid (one grid step at least)."""
        if self.bookings < ENOUGH or self.mean_busy_hours is None:
            return None
        step = grid() / timedelta(hours=1)
        return max(step, math.ceil(self.mean_busy_hours / step) * step)

    def about(self, hours: float | None) -> str | None:
        """Words for a request of ``hours``: None unless it is far longer than the history suggests."""
        if hours is None or self.bookings < ENOUGH or not self.mean_busy_hours:
            return None
        if hours < FAR_LONGER * self.mean_busy_hours:
            return None
        size = "one-GPU" if self.gpus == 1 else f"{self.gpus}-GPU"
        return (
            f"Your last {self.bookings} {size} bookings were busy {self.mean_busy_hours:.1f} h on average "
            f"(booked {self.mean_booked_hours:.1f} h); this one asks for {hours:g} h. "
            f"About {self.suggested_hours:g} h would leave the rest to others."
        )


def length_advice(*, user: Any, gpus: int, now: datetime) -> LengthAdvice:
    """The figures from ``user``'s last HISTORY ended, measured, approved bookings of ``gpus`` GPUs."""
    candidates = (
        Reservation.objects.filter(user=user, status=Reservation.Status.APPROVED, extends__isnull=True, end__lte=now)
        .annotate(units=Count("allocations", filter=Q(allocations__active=True), distinct=True))
        .filter(units=gpus)
        .order_by("-end")
        .values_list("pk", "start", "end")[: HISTORY * 3]
    )
    booked = {pk: (end - start) / timedelta(hours=1) for pk, start, end in candidates}
    usage = (
        UsageHour.objects.filter(reservation_id__in=list(booked))
        .values("reservation_id")
        .annotate(used=Sum("used_minutes"), measured=Sum("minutes_measured"))
        .order_by()
    )
    busy = {row["reservation_id"]: row["used"] / 60 / gpus for row in usage if row["measured"]}
    chosen = [pk for pk in booked if pk in busy][:HISTORY]  # newest first, as the candidates came
    if not chosen:
        return LengthAdvice(gpus=gpus, bookings=0, mean_busy_hours=None, mean_booked_hours=None)
    return LengthAdvice(
        gpus=gpus,
        bookings=len(chosen),
        mean_busy_hours=sum(busy[pk] for pk in chosen) / len(chosen),
        mean_booked_hours=sum(booked[pk] for pk in chosen) / len(chosen),
    )
