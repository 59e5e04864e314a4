"""Usage of bookings on Slurm-managed nodes, counted from the jobs that ran in their reservations (issue 23).

Our agent does not run on a Slurm node to measure its GPUs; where the cluster's accounting is on, the jobs in a
booking's reservation say how much of it was used (slurm/usage.py reads them; ``slurm.signals.jobs_read`` brings
them here). Each hour of the booking up to now gets one ``UsageHour`` row per booked GPU (``source`` SLURM):
- the booked minutes of that hour are reported and measured (what the jobs did is known for all of them);
- the GPU-minutes the jobs held (their GPUs times their minutes in the hour, rounded up) are the used minutes,
  filled GPU by GPU in index order, since Slurm does not say which of a node's GPUs a job was given. A job that
  asked for no GPU used none of them.
So the report's used GPU-hours, efficiency and no-shows mean for these bookings what they mean for the others; a
booking without accounting has no rows, and stays unknown rather than unused, unless our agent runs on the node as
well and measures it (docs/slurm.md): its telemetry counts then, and the jobs' count replaces it where there is one.
Energy is not known from the jobs: none is written.
Recomputed whole per booking (delete and insert its rows), so reading the same jobs twice changes nothing.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Q

from accounting.models import UsageHour
from accounting.rollup import ROLLUP_LOCK, floor_hour
from kernel.locks import advisory_xact_lock
from reservations.models import Allocation, Reservation
from slurm.models import ReservationJob

HOUR = timedelta(hours=1)


def slurm_usage_rollup(*, reservation_ids: Iterable[int], now: datetime) -> int:
    """Recompute the usage rows of these bookings from their jobs; returns the rows written."""
    ids = list(reservation_ids)
    bookings = Reservation.objects.filter(pk__in=ids, status=Reservation.Status.APPROVED)
    allocations: dict[int, list[Allocation]] = {}
    for allocation in Allocation.objects.filter(reservation__in=bookings, active=True).order_by("gpu__index"):
        allocations.setdefault(allocation.reservation_id, []).append(allocation)
    jobs: dict[int, list[ReservationJob]] = {}
    for job in ReservationJob.objects.filter(reservation__in=bookings):
        jobs.setdefault(job.reservation_id, []).append(job)
    rows = []
    for booking in bookings:
        held = allocations.get(booking.pk, [])
        if held:
            rows += _rows(booking, held, jobs.get(booking.pk, []), now)
    with transaction.atomic():
        advisory_xact_lock(ROLLUP_LOCK)  # the telemetry rollup's: one of the two rewrites rows at a time
        # And the telemetry rows of those it counts, where our agent also runs on the node: the jobs' count stands
        # alone for them.
        UsageHour.objects.filter(
            Q(reservation_id__in=ids, source=UsageHour.Source.SLURM) | Q(reservation__in=bookings)
        ).delete()
        UsageHour.objects.bulk_create(rows, batch_size=2000)
    return len(rows)


def _rows(booking: Reservation, held: list[Allocation], jobs: list[ReservationJob], now: datetime) -> list[UsageHour]:
    start, until = held[0].start, min(held[0].end, now)  # a booking's allocations share its times
    rows = []
    hour = floor_hour(start)
    while hour < until:
        begin, end = max(hour, start), min(hour + HOUR, until)
        booked = round((end - begin).total_seconds() / 60)
        # Rounded up: a job of a few seconds used the booking, and must not make it a no-show.
        used = math.ceil(sum(min(job.gpus, len(held)) * _minutes(job, begin, end, now) for job in jobs) - 1e-9)
        for place, allocation in enumerate(held):
            # This GPU's share of the GPU-minutes: the first GPUs fill first.
            mine = min(booked, max(0, used - place * booked))
            rows.append(
                UsageHour(
                    gpu_id=allocation.gpu_id,
                    hour=hour,
                    reservation_id=booking.pk,
                    user_id=booking.user_id,
                    minutes_reported=booked,
                    minutes_measured=booked,
                    used_minutes=mine,
                    utilization_sum=0,
                    utilization_samples=0,
                    source=UsageHour.Source.SLURM,
                )
            )
        hour += HOUR
    return [row for row in rows if row.minutes_reported]


def _minutes(job: ReservationJob, begin: datetime, end: datetime, now: datetime) -> float:
    """The job's minutes inside [begin, end)."""
    overlap = min(end, job.end or now) - max(begin, job.start)
    return max(0.0, overlap.total_seconds() / 60)
