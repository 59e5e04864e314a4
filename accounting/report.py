"""The usage report: who booked how much GPU time over a period, and how much of it they used.

For each row (a person, a group, a node or a GPU):
- booked GPU-hours: the approved allocations' time inside the period, up to now (a released
  booking counts until its release);
- used GPU-hours: the booked minutes whose mean utilisation reached USAGE_USED_THRESHOLD_PCT
  (accounting.UsageHour, rolled up from the agents' telemetry);
- unmeasured GPU-hours: minutes reported without any utilisation reading: MIG slices on cards
  NVML cannot measure per slice (no GPM: A100, A30), neither used nor idle as far as anyone knows;
- efficiency: used / (booked - unmeasured), the share of the time that could be judged;
- energy: kWh the booked GPUs used (their cards' energy counters: nodes/energy.py), and of that the kWh of
  measured minutes under the threshold (idle); estimated where a counter reset, a gap or a card without a
  counter made any part of it so. A MIG slice takes its share of its card's energy (accounting/rollup.py);
- fully idle node-hours (booking admins, by node): hours no booking held any GPU of an active node
  (accounting/idle_nodes.py); the fleet's sum is in every admin's report;
- released early: bookings released before their end during the period;
- no-shows: bookings that ended in the period with utilisation readings from their GPUs but not
  one used minute. A booking whose node reported no utilisation is not counted either way:
  nobody knows.

And the demand by hour of the week: booked GPU-hours (approved and pending) falling into each
hour of the week, in the reader's time zone.

A researcher's report covers their own bookings only; a booking admin's covers everyone's. Each
figure is one aggregate query whatever the period's length (bench/reports.py times a year of
100 GPUs).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db.models import Count, DurationField, Exists, ExpressionWrapper, F, OuterRef, Q, Sum, Value
from django.db.models.functions import ExtractHour, ExtractIsoWeekDay, ExtractMinute, Greatest, Least
from django.utils import timezone

from accounting.idle_nodes import idle_node_hours
from accounting.models import UsageHour
from accounting.tariffs import Cost, usage_costs
from nodes.models import Gpu, Node, card_share
from nodes.usage import kwh
from reservations.models import Allocation, Reservation

Status = Reservation.Status
DIMENSIONS = ("user", "group", "node", "gpu")
# How each dimension is reached from an allocation, and from a usage hour.
_ALLOCATION_KEY = {
    "user": "reservation__user_id",
    "group": "reservation__user__groups",
    "node": "gpu__node_id",
    "gpu": "gpu_id",
}
_USAGE_KEY = {"user": "user_id", "group": "user__groups", "node": "gpu__node_id", "gpu": "gpu_id"}


@dataclass
class ReportRow:
    key: int | None
    label: str
    bookings: int = 0
    booked_gpu_hours: float = 0.0
    used_gpu_hours: float = 0.0
    unmeasured_gpu_hours: float = 0.0
    released_early: int = 0
    no_shows: int = 0
    no_show_gpu_hours: float = 0.0
    energy_kwh: float | None = None
    idle_energy_kwh: float | None = None
    energy_estimated: bool = False
    cost: Cost = field(default_factory=Cost)  # of the energy, with the admin's tariffs (accounting/tariffs.py)
    idle_node_hours: float | None = None  # by node, for booking admins

    def add_energy(self, kwh: float | None, idle_kwh: float | None, estimated: bool) -> None:
        if kwh is not None:
            self.energy_kwh = (self.energy_kwh or 0.0) + kwh
            self.idle_energy_kwh = (self.idle_energy_kwh or 0.0) + (idle_kwh or 0.0)
            self.energy_estimated = self.energy_estimated or estimated

    @property
    def efficiency(self) -> float | None:
        judged = self.booked_gpu_hours - self.unmeasured_gpu_hours
        return min(1.0, self.used_gpu_hours / judged) if judged > 0 else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "label": self.label,
            "bookings": self.bookings,
            "booked_gpu_hours": round(self.booked_gpu_hours, 2),
            "used_gpu_hours": round(self.used_gpu_hours, 2),
            "unmeasured_gpu_hours": round(self.unmeasured_gpu_hours, 2),
            "efficiency": None if self.efficiency is None else round(self.efficiency, 4),
            "released_early": self.released_early,
            "no_shows": self.no_shows,
            "no_show_gpu_hours": round(self.no_show_gpu_hours, 2),
            "energy_kwh": None if self.energy_kwh is None else round(self.energy_kwh, 3),
            "idle_energy_kwh": None if self.idle_energy_kwh is None else round(self.idle_energy_kwh, 3),
            "energy_estimated": self.energy_estimated,
            "cost": None if self.cost.cost is None else round(self.cost.cost, 2),
            "co2_kg": None if self.cost.co2_kg is None else round(self.cost.co2_kg, 4),
            "idle_node_hours": None if self.idle_node_hours is None else round(self.idle_node_hours, 2),
        }


@dataclass
class Report:
    start: datetime
    end: datetime
    by: str
    rows: list[ReportRow] = field(default_factory=list)
    # The fleet's fully idle node-hours and all its node-hours in the period: for booking admins only.
    idle_node_hours: float | None = None
    node_hours: float | None = None

    @property
    def has_unmeasured(self) -> bool:
        return any(row.unmeasured_gpu_hours > 0 for row in self.rows)

    @property
    def has_energy(self) -> bool:
        return any(row.energy_kwh is not None for row in self.rows)

    @property
    def has_cost(self) -> bool:
        return any(row.cost.cost is not None for row in self.rows)

    @property
    def has_co2(self) -> bool:
        return any(row.cost.co2_kg is not None for row in self.rows)

    @property
    def total(self) -> ReportRow:
        total = ReportRow(key=None, label="All")
        if self.by == "group":  # a person in two groups appears in both: a sum would count them twice
            return total
        for row in self.rows:
            total.bookings += row.bookings
            total.booked_gpu_hours += row.booked_gpu_hours
            total.used_gpu_hours += row.used_gpu_hours
            total.unmeasured_gpu_hours += row.unmeasured_gpu_hours
            total.released_early += row.released_early
            total.no_shows += row.no_shows
            total.no_show_gpu_hours += row.no_show_gpu_hours
            total.add_energy(row.energy_kwh, row.idle_energy_kwh, row.energy_estimated)
            total.cost += row.cost
        if self.by == "node":
            total.idle_node_hours = self.idle_node_hours
        return total


# A unit's share of a card, as grouping columns: a card has no parent (share 1); a MIG slice counts its
# compute slices over its card's (a 3g.40gb of a 7-slice card is 3/7 GPU).
SHARE = {"unit_slices": F("gpu__compute_slices"), "card_slices": F("gpu__parent__compute_slices")}


def share_of(item: Mapping[str, Any]) -> float:
    """The share of a card a row grouped by ``SHARE`` counts as."""
    return float(card_share(item["unit_slices"], item["card_slices"]))


# The energy of usage hours, as reports and a booking's page sum it (read by energy_figures).
ENERGY_TOTALS = {
    "energy": Sum("energy_mj"),
    "idle_energy": Sum("idle_energy_mj"),
    "energy_estimated": Count("pk", filter=Q(energy_estimated=True)),
}


def energy_figures(totals: Mapping[str, Any]) -> tuple[float | None, float | None, bool]:
    """kWh, idle kWh and whether any part is estimated, from aggregates by ENERGY_TOTALS."""
    return kwh(totals["energy"]), kwh(totals["idle_energy"]), totals["energy_estimated"] > 0


def _hours(value: timedelta | None) -> float:
    return value.total_seconds() / 3600 if value else 0.0


def usage_report(*, start: datetime, end: datetime, by: str, viewer: Any, now: datetime | None = None) -> Report:
    if by not in DIMENSIONS:
        raise ValueError(f"by must be one of {', '.join(DIMENSIONS)}")
    now = now or timezone.now()
    rows: dict[int | None, ReportRow] = {}

    def row(key: int | None) -> ReportRow:
        if key not in rows:
            rows[key] = ReportRow(key=key, label="")
        return rows[key]

    # Booked time counts until now: hours still to come could not have been used yet, and would
    # lower every efficiency (the demand view shows what is booked ahead).
    until = max(start, min(end, now))
    allocations = Allocation.objects.filter(
        active=True, reservation__status=Status.APPROVED, start__lt=until, end__gt=start
    )
    # Usage rows are hourly: an hour counts when it begins inside the period.
    usage = UsageHour.objects.filter(hour__gte=start, hour__lt=end, reservation__isnull=False)
    if not viewer.is_booking_admin:
        allocations = allocations.filter(reservation__user=viewer)
        usage = usage.filter(user=viewer)

    overlap = ExpressionWrapper(
        Least(F("end"), Value(until)) - Greatest(F("start"), Value(start)), output_field=DurationField()
    )
    released = Q(reservation__released_at__gte=start, reservation__released_at__lt=end)
    for item in (
        allocations.values(key=F(_ALLOCATION_KEY[by]))
        .annotate(
            bookings=Count("reservation", distinct=True), released=Count("reservation", distinct=True, filter=released)
        )
        .order_by()
    ):
        target = row(item["key"])
        target.bookings, target.released_early = item["bookings"], item["released"]
    # GPU-hours count a MIG slice by its share of its card: grouped by share too, weighted here.
    for booked in allocations.values(key=F(_ALLOCATION_KEY[by]), **SHARE).annotate(booked=Sum(overlap)).order_by():
        row(booked["key"]).booked_gpu_hours += _hours(booked["booked"]) * share_of(booked)

    unmeasured = Sum(F("minutes_reported") - F("minutes_measured"))
    per_share = usage.values(key=F(_USAGE_KEY[by]), **SHARE).annotate(
        used=Sum("used_minutes"), unmeasured=unmeasured, **ENERGY_TOTALS
    )
    for used_item in per_share.order_by():
        target, share = row(used_item["key"]), share_of(used_item)
        target.used_gpu_hours += (used_item["used"] or 0) / 60 * share
        target.unmeasured_gpu_hours += (used_item["unmeasured"] or 0) / 60 * share
        # Energy is not weighted by share: a MIG slice's is its share of its card's already (accounting/rollup.py).
        target.add_energy(*energy_figures(used_item))
    for key, cost in usage_costs(usage, F(_USAGE_KEY[by])).items():
        row(key).cost += cost

    measured = UsageHour.objects.filter(reservation=OuterRef("reservation"), minutes_measured__gt=0)
    used = UsageHour.objects.filter(reservation=OuterRef("reservation"), used_minutes__gt=0)
    no_shows = (
        allocations.filter(reservation__end__gt=start, reservation__end__lte=min(end, now))
        .filter(Exists(measured))
        .exclude(Exists(used))
    )
    no_show_counts = no_shows.values(key=F(_ALLOCATION_KEY[by])).annotate(count=Count("reservation", distinct=True))
    for no_show in no_show_counts.order_by():
        row(no_show["key"]).no_shows = no_show["count"]
    for missed in no_shows.values(key=F(_ALLOCATION_KEY[by]), **SHARE).annotate(booked=Sum(overlap)).order_by():
        row(missed["key"]).no_show_gpu_hours += _hours(missed["booked"]) * share_of(missed)

    fleet: dict[str, float] = {}
    if viewer.is_booking_admin:
        idle = idle_node_hours(start=start, end=end, now=now)
        if by == "node":  # every active node, the unbooked ones too: those are the idle ones
            for node_id, hours in idle.idle.items():
                row(node_id).idle_node_hours = hours
        fleet = {"idle_node_hours": idle.idle_node_hours, "node_hours": idle.node_hours}

    _label(rows, by)
    ordered = sorted(rows.values(), key=lambda r: (-r.booked_gpu_hours, r.label))
    return Report(start=start, end=end, by=by, rows=ordered, **fleet)


def _label(rows: dict[int | None, ReportRow], by: str) -> None:
    keys = [key for key in rows if key is not None]
    if by == "user":
        names = dict(get_user_model().objects.filter(pk__in=keys).values_list("pk", "username"))
    elif by == "group":
        names = dict(Group.objects.filter(pk__in=keys).values_list("pk", "name"))
    elif by == "node":
        names = dict(Node.objects.filter(pk__in=keys).values_list("pk", "name"))
    else:
        names = {
            pk: f"{node}/GPU {index}" + (f" {profile}@{placement}" if profile else "")
            for pk, node, index, profile, placement in Gpu.objects.filter(pk__in=keys).values_list(
                "pk", "node__name", "index", "profile", "placement_start"
            )
        }
    for key, row in rows.items():
        fallback = "(no group)" if by == "group" and key is None else f"#{key}"
        row.label = names.get(key, fallback) if key is not None else fallback


# --- demand by hour of the week ----------------------------------------------------------------

QUARTER_SECONDS = 900
QUARTERS_PER_WEEK = 7 * 24 * 4
WEEK_SECONDS = 7 * 24 * 3600


def demand_by_hour_of_week(*, start: datetime, end: datetime, viewer: Any, zone: str) -> list[list[float]]:
    """Booked GPU-hours (approved and pending) in each hour of the week, Monday first, in ``zone``:
    ``[weekday][hour]``: everyone's for a booking admin or ``viewer`` None (the suggestions' contention,
    a figure about the whole fleet), a researcher's own otherwise.

    The database groups the allocations by their (clipped) start's weekday, hour and minute in the
    reader's zone and by their length; each group then adds its time to a circular difference
    array of the week's quarter hours (bookings snap to the quarter-hour grid), whole weeks to every
    slot at once. So the work outside the database is per group (a few thousand for a year), not
    per booking or per hour booked.
    """
    tz = ZoneInfo(zone)
    allocations = Allocation.objects.filter(
        active=True, reservation__status__in=[Status.APPROVED, Status.PENDING], start__lt=end, end__gt=start
    )
    if viewer is not None and not viewer.is_booking_admin:
        allocations = allocations.filter(reservation__user=viewer)
    first = Greatest(F("start"), Value(start))
    groups = (
        allocations.annotate(
            weekday=ExtractIsoWeekDay(first, tzinfo=tz),
            hour=ExtractHour(first, tzinfo=tz),
            minute=ExtractMinute(first, tzinfo=tz),
            length=ExpressionWrapper(Least(F("end"), Value(end)) - first, output_field=DurationField()),
        )
        .values("weekday", "hour", "minute", "length", **SHARE)
        .annotate(count=Count("id"))
        .order_by()
    )
    steps = [0.0] * (QUARTERS_PER_WEEK + 1)
    whole_weeks = 0.0
    for group in groups:
        count = group["count"] * share_of(group)  # GPUs: a MIG slice as its share of a card
        offset = ((group["weekday"] - 1) * 24 + group["hour"]) * 3600 + group["minute"] * 60
        weeks, rest = divmod(group["length"].total_seconds(), WEEK_SECONDS)
        whole_weeks += int(weeks) * count
        begin, stop = int(offset // QUARTER_SECONDS), int((offset + rest) // QUARTER_SECONDS)
        steps[begin] += count
        if stop <= QUARTERS_PER_WEEK:
            steps[stop] -= count
        else:  # wraps past Sunday midnight
            steps[QUARTERS_PER_WEEK] -= count
            steps[0] += count
            steps[stop - QUARTERS_PER_WEEK] -= count
    per_hour = [[0.0] * 24 for _ in range(7)]
    running = 0.0
    for slot in range(QUARTERS_PER_WEEK):
        running += steps[slot]
        day, hour = divmod(slot // 4, 24)
        per_hour[day][hour] += (running + whole_weeks) * 0.25
    return [[round(value, 2) for value in day] for day in per_hour]


def peak_hours(demand: list[list[float]], share: float = 0.25) -> set[tuple[int, int]]:
    """The busiest ``share`` of the week's hours (with any demand): the peak."""
    ranked = sorted(
        ((value, day, hour) for day, hours in enumerate(demand) for hour, value in enumerate(hours)), reverse=True
    )
    busy = [item for item in ranked if item[0] > 0]
    return {(day, hour) for _, day, hour in busy[: max(1, round(len(ranked) * share))]} if busy else set()
