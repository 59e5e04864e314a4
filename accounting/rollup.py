"""Rolling the per-minute telemetry up into ``UsageHour`` rows, attributed to bookings.

Each run recomputes whole hours from the minutes (delete and insert in one transaction), so running
it twice, or two at once, or after a late report, gives the same rows: it is idempotent. It starts
from the last hour it wrote, or two hours back if that is later, so after downtime it catches up
with every minute still kept (TELEMETRY_MINUTES_KEEP_DAYS).

A minute belongs to the approved booking whose allocation covered that GPU at that minute; a
minute nobody held has no booking (use without a booking, or nothing). A MIG slice has no energy counter
of its own (NVML counts per card): each of its minutes takes its share of its card's minute, by compute
slices (a 3g of a 7-slice card 3/7), marked estimated.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import BigIntegerField, Count, ExpressionWrapper, F, Max, Min, OuterRef, Q, Subquery, Sum
from django.db.models.functions import Coalesce, TruncHour
from django.utils import timezone

from accounting.models import UsageHour
from kernel.locks import advisory_xact_lock
from nodes.models import GpuMinute
from nodes.usage import busy_minutes
from reservations.models import Allocation, Reservation

RECENT = timedelta(hours=2)
ROLLUP_LOCK = 7_446_001  # any number of our own, for PostgreSQL's advisory lock: rows of UsageHour are rewritten


def floor_hour(moment: datetime) -> datetime:
    return moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def rollup_recent(now: datetime | None = None) -> int:
    """Beat's entry point: recompute from the last hour written (or two hours back)."""
    now = now or timezone.now()
    last = UsageHour.objects.filter(source=UsageHour.Source.TELEMETRY).aggregate(last=Max("hour"))["last"]
    if last is None:
        last = GpuMinute.objects.aggregate(first=Min("minute"))["first"] or now
    return rollup(since=min(last, now - RECENT), until=now)


def rollup(*, since: datetime, until: datetime) -> int:
    """Recompute every hour from ``since``'s to ``until``'s; returns the rows written."""
    first = floor_hour(since)
    holder = Allocation.objects.filter(
        gpu_id=OuterRef("gpu_id"),
        active=True,
        reservation__status=Reservation.Status.APPROVED,
        start__lte=OuterRef("minute"),
        end__gt=OuterRef("minute"),
    ).order_by("start")
    threshold = settings.USAGE_USED_THRESHOLD_PCT
    used = busy_minutes(threshold)
    card_minute = GpuMinute.objects.filter(gpu_id=OuterRef("gpu__parent_id"), minute=OuterRef("minute"))
    slice_energy = ExpressionWrapper(
        Subquery(card_minute.values("energy_mj")[:1]) * F("gpu__compute_slices") / F("gpu__parent__compute_slices"),
        output_field=BigIntegerField(),
    )
    hours = (
        GpuMinute.objects.filter(minute__gte=first, minute__lt=until)
        .annotate(
            in_hour=TruncHour("minute", tzinfo=UTC),
            held_by=Subquery(holder.values("reservation_id")[:1]),
            holder_id=Subquery(holder.values("reservation__user_id")[:1]),
            energy=Coalesce("energy_mj", slice_energy),
        )
        .values("gpu_id", "in_hour", "held_by", "holder_id")
        .annotate(
            minutes=Count("id", filter=Q(samples__gt=0)),  # a minute with energy alone had no reading
            measured=Count("id", filter=Q(utilization_samples__gt=0)),
            used_minutes=Count("id", filter=used),
            utilization=Sum("utilization_sum"),
            samples=Sum("utilization_samples"),
            memory=Max("memory_used_max_mib"),
            energy_used=Sum("energy"),
            idle_energy=Sum("energy", filter=Q(utilization_samples__gt=0) & ~used),
            energy_estimated=Count("id", filter=Q(energy_estimated=True) | Q(energy_mj=None, energy__isnull=False)),
        )
        .order_by()
    )
    rows = [
        UsageHour(
            gpu_id=row["gpu_id"],
            hour=row["in_hour"],
            reservation_id=row["held_by"],
            user_id=row["holder_id"],
            minutes_reported=row["minutes"],
            minutes_measured=row["measured"],
            used_minutes=row["used_minutes"],
            utilization_sum=row["utilization"] or 0,
            utilization_samples=row["samples"] or 0,
            memory_used_max_mib=row["memory"],
            energy_mj=row["energy_used"],
            idle_energy_mj=row["idle_energy"],
            energy_estimated=row["energy_estimated"] > 0,
        )
        for row in hours
    ]
    with transaction.atomic():
        advisory_xact_lock(ROLLUP_LOCK)  # two runs at once would each delete, then both insert: one at a time
        # A booking whose usage its Slurm cluster's accounting counts (accounting/slurm_usage.py) is counted so
        # alone, even where our agent measures the node too: the jobs say what the holder used.
        counted = set(
            UsageHour.objects.filter(hour__gte=first, source=UsageHour.Source.SLURM).values_list(
                "reservation_id", flat=True
            )
        )
        rows = [row for row in rows if row.reservation_id not in counted]
        UsageHour.objects.filter(hour__gte=first, source=UsageHour.Source.TELEMETRY).delete()
        UsageHour.objects.bulk_create(rows, batch_size=2000)
    return len(rows)
