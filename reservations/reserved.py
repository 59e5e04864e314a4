"""Reserved capacity: GPUs (or any N GPUs of a node) kept for one group over a window, once or repeating.

The rule (docs/booking-rules.md, "Reserved capacity"), checked in the booking transaction by every path that
takes a slot (a booking, a series occurrence, an extension's added time, a waitlist offer):

- inside an occurrence that has not been released, only the group's members book the reserved GPUs: a
  non-member's unit that shares a part of a card with a reserved unit (the GPU itself, a slice of a reserved
  card, the card of a reserved slice) is refused;
- with a count N instead of GPUs, non-members together hold at most the bookable GPUs the window counts from
  (its node's, or its model's on every node, or its model's on its node) minus N over the occurrence: the peak
  of their live holdings there over the overlap plus what they ask of it. That sum depends on other people's
  bookings, so the check takes the window's own lock (a transaction-scoped advisory lock per window, in window
  order, after the user and the cards: the booking lock order) and two non-members queue up instead of both
  taking the last unreserved GPU;
- booking admins book anywhere, as they book past the limits;
- from ``release_hours_before`` hours before its start (the site's RESERVED_RELEASE_HOURS when unset; 0 never)
  an occurrence restricts nobody: its members' bookings keep their own slots, the rest is free for anyone, and
  the beat task ``reservations.release_reserved_capacity`` announces it once (``reserved_capacity_released``).

A repeating window keeps its wall-clock time in its zone across daylight saving time: it is expanded by
reservations/recurrence.py, bounded as a series is (UNTIL or COUNT, SERIES_MAX_OCCURRENCES, SERIES_MAX_DAYS).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from fractions import Fraction
from typing import Any
from zoneinfo import ZoneInfo

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from accounts.models import User
from kernel.locks import advisory_xact_lock
from nodes.models import BOOKABLE_GPUS, Gpu, Node, card_share
from reservations.exceptions import InvalidBooking, ReservedConflict
from reservations.models import Allocation, ReservedCapacity
from reservations.recurrence import expand, normalise_rule, series_zone
from reservations.timegrid import format_day_time

logger = logging.getLogger(__name__)


# The most hours before its start a window may release (admin and RESERVED_RELEASE_HOURS keep to it): further
# ahead means nothing, and millions of hours would put the release before the year 1, an OverflowError in every
# booking of the node.
MAX_RELEASE_HOURS = 366 * 24


@dataclass(frozen=True)
class ReservedOccurrence:
    """One occurrence of a reserved window, and when it releases (None: never)."""

    reserved: ReservedCapacity
    start: datetime
    end: datetime
    release_at: datetime | None

    def released(self, now: datetime) -> bool:
        return self.release_at is not None and now >= self.release_at


def release_hours(reserved: ReservedCapacity) -> int:
    """The window's own hours, else the site default; 0 means it never releases."""
    if reserved.release_hours_before is not None:
        return reserved.release_hours_before
    return int(settings.RESERVED_RELEASE_HOURS)


def window_zone(reserved: ReservedCapacity) -> ZoneInfo:
    return series_zone(reserved.zone) if reserved.zone.strip() else ZoneInfo("UTC")


def occurrence_periods(reserved: ReservedCapacity) -> list[tuple[datetime, datetime]]:
    """Every occurrence's [start, end), in UTC: the window itself, or its rule's occurrences (wall-clock
    times in its zone). Raises InvalidBooking for a rule that cannot be expanded (admin shows it)."""
    if not reserved.rule.strip():
        return [(reserved.start, reserved.end)]
    zone = window_zone(reserved)
    local_start, local_end = timezone.localtime(reserved.start, zone), timezone.localtime(reserved.end, zone)
    occurrences = expand(
        rule=normalise_rule(reserved.rule),
        zone=zone,
        first_day=local_start.date(),
        start_time=local_start.time().replace(tzinfo=None),
        duration=local_end.replace(tzinfo=None) - local_start.replace(tzinfo=None),
    )
    return [(occurrence.start, occurrence.end) for occurrence in occurrences]


def occurrences_of(reserved: ReservedCapacity, start: datetime, end: datetime) -> list[ReservedOccurrence]:
    """The window's occurrences overlapping [start, end)."""
    hours = release_hours(reserved)
    try:
        periods = occurrence_periods(reserved)
    except InvalidBooking as exc:
        # Admin refuses such a rule; one stored before SERIES_MAX_* were lowered must not break every booking
        # of its node: it is left out, loudly.
        logger.error("Reserved capacity #%s is left out: its rule no longer expands (%s)", reserved.pk, exc)
        return []
    return [
        ReservedOccurrence(reserved, o_start, o_end, o_start - timedelta(hours=hours) if hours else None)
        for o_start, o_end in periods
        if o_start < end and o_end > start
    ]


def reserved_overlapping(
    *, start: datetime, end: datetime, now: datetime, nodes: Iterable[Node] | None = None, released: bool = False
) -> list[ReservedOccurrence]:
    """Occurrences overlapping [start, end) on these nodes (all when None), earliest first; the released ones
    only when ``released``. Two queries (the windows, their GPUs and groups prefetched)."""
    # A repeating window's occurrences all fall within SERIES_MAX_DAYS of its first one.
    reach = timedelta(days=settings.SERIES_MAX_DAYS + 1)
    windows = ReservedCapacity.objects.filter(start__lt=end).filter(
        Q(end__gt=start) | (~Q(rule="") & Q(start__gt=start - reach))
    )
    if nodes is not None:
        node_ids = [node.pk for node in nodes]
        models_there = Gpu.objects.filter(node__in=node_ids).values("model")
        windows = windows.filter(Q(node__in=node_ids) | Q(node__isnull=True, gpu_model__in=models_there))
    windows = windows.select_related("group", "node").prefetch_related("gpus__node")
    found = [
        occurrence
        for reserved in windows
        for occurrence in occurrences_of(reserved, start, end)
        if released or not occurrence.released(now)
    ]
    return sorted(found, key=lambda o: (o.start, o.reserved.pk))


def applies_to(occurrence: ReservedOccurrence, group_ids: set[int]) -> bool:
    return occurrence.reserved.group_id not in group_ids


def _group_ids(user: User) -> set[int]:
    return set(user.groups.values_list("pk", flat=True))


# --- the booking rule ----------------------------------------------------------------------------


def check_reserved_capacity(
    *,
    user: User,
    actor: Any,
    node: Node,
    gpus: Sequence[Gpu],
    start: datetime,
    end: datetime,
    now: datetime,
    exclude_reservation_id: int | None = None,
    any_reserved: bool | None = None,
) -> None:
    """Refuse ``user`` taking ``gpus`` (units of ``node``) over [start, end) where reserved capacity keeps it
    from them (ReservedConflict, a 409 naming the group, the GPUs and the window). Called in the booking
    transaction after the user's and the cards' locks; it takes the windows' own locks when a count applies.
    ``any_reserved``: whether any ReservedCapacity row exists, where the caller asked already."""
    if getattr(actor, "is_booking_admin", False):
        return
    if any_reserved is None:
        any_reserved = ReservedCapacity.objects.exists()
    if not any_reserved:
        return  # most sites reserve nothing: one cheap question instead of building the windows' query
    occurrences = reserved_overlapping(start=start, end=end, now=now, nodes=[node])
    if not occurrences:
        return
    groups = _group_ids(user)
    outside = [o for o in occurrences if applies_to(o, groups)]
    for occurrence in outside:
        if occurrence.reserved.count is None:
            hit = [unit for unit in gpus if any(_same_part(unit, kept) for kept in occurrence.reserved.gpus.all())]
            if hit:
                raise _gpus_refused(occurrence, hit)
    counted = [(o, [unit for unit in gpus if o.reserved.covers(unit)]) for o in outside if o.reserved.count is not None]
    counted = [(occurrence, units) for occurrence, units in counted if units]
    if not counted:
        return
    lock_windows([occurrence.reserved for occurrence, _ in counted])
    for occurrence, units in counted:
        asked = sum((unit.share_of(unit.parent) for unit in units), Fraction(0))
        capacity = capacity_of(occurrence.reserved)
        o_start, o_end = max(start, occurrence.start), min(end, occurrence.end)
        held = others_peak(
            occurrence=occurrence, start=o_start, end=o_end, exclude_reservation_id=exclude_reservation_id
        )
        allowed = capacity - (occurrence.reserved.count or 0)
        if held + asked > allowed:
            raise _count_refused(occurrence, capacity=capacity, held=held, asked=asked, allowed=allowed)


# Advisory-lock numbers of reserved windows: this base plus the window's id (PostgreSQL's bigint key).
_LOCK_BASE = 7_446_100_000


def lock_windows(windows: Iterable[ReservedCapacity]) -> None:
    """A count depends on everyone else's bookings where it counts (a node, or a model on every node): the
    window's own lock makes non-members queue up, taken in window order after the user and the cards (never the
    other way round). An advisory lock, not a row: admins saving nodes or windows never wait for it."""
    for pk in sorted({window.pk for window in windows}):
        advisory_xact_lock(_LOCK_BASE + pk)


def node_capacity(node: Node) -> int:
    """The node's bookable cards, which a count of reserved GPUs of the node is taken from."""
    return Gpu.objects.filter(BOOKABLE_GPUS, node=node, parent__isnull=True).count()


def capacity_of(reserved: ReservedCapacity) -> int:
    """The bookable cards a window's count is taken from: its node's, its model's on every node, or both."""
    cards = Gpu.objects.filter(BOOKABLE_GPUS, parent__isnull=True)
    if reserved.node_id is not None:
        cards = cards.filter(node_id=reserved.node_id)
    if reserved.gpu_model:
        cards = cards.filter(model=reserved.gpu_model)
    return cards.count()


def others_peak(
    *, occurrence: ReservedOccurrence, start: datetime, end: datetime, exclude_reservation_id: int | None = None
) -> Fraction:
    """The most GPUs non-members of the occurrence's group hold at once where its count is taken from (its node,
    or its model on every node) within [start, end) (live bookings and offers: every active allocation; a slice
    counts as its share of its card)."""
    reserved = occurrence.reserved
    members = reserved.group.user_set.values("pk")
    rows = Allocation.objects.filter(active=True, start__lt=end, end__gt=start).exclude(reservation__user__in=members)
    if reserved.node_id is not None:
        rows = rows.filter(card__node_id=reserved.node_id)
    if reserved.gpu_model:
        rows = rows.filter(card__model=reserved.gpu_model)
    if exclude_reservation_id is not None:
        rows = rows.exclude(reservation_id=exclude_reservation_id)
    changes: list[tuple[datetime, Fraction]] = []
    for row_start, row_end, slices, card_slices in rows.values_list(
        "start", "end", "gpu__compute_slices", "gpu__parent__compute_slices"
    ):
        share = card_share(slices, card_slices)
        changes += [(max(row_start, start), share), (min(row_end, end), -share)]
    changes.sort(key=lambda change: (change[0], change[1]))  # an end before a start at the same moment
    peak = current = Fraction(0)
    for _, delta in changes:
        current += delta
        peak = max(peak, current)
    return peak


def _same_part(unit: Gpu, kept: Gpu) -> bool:
    """Whether two units share a part of one card (a GPU itself, a card and its slice, overlapping slices)."""
    if unit.card_id != kept.card_id:
        return False
    low, high = unit.placement
    kept_low, kept_high = kept.placement
    return low < kept_high and kept_low < high


# --- what the refusal says -----------------------------------------------------------------------


def describe_window(start: datetime, end: datetime) -> str:
    """'Mon 7 Jan 2030, 09:00–12:00 UTC' in the reader's zone (both ends in full when the days differ)."""
    local_start, local_end = timezone.localtime(start), timezone.localtime(end)
    if local_start.date() == local_end.date() and local_start.tzname() == local_end.tzname():
        return f"{format_day_time(start)}–{local_end:%H:%M} {local_end.tzname()}"
    return f"{format_day_time(start, abbreviation=True)} – {format_day_time(end, abbreviation=True)}"


def unit_name(unit: Gpu) -> str:
    return f"GPU {unit.index}" + (f" slice {unit.profile}@{unit.placement_start}" if unit.parent_id else "")


def _details(occurrence: ReservedOccurrence, **extra: Any) -> dict[str, Any]:
    reserved = occurrence.reserved
    return {
        "reserved": {
            "id": reserved.pk,
            "group": reserved.group.name,
            "label": reserved.label,
            "node": reserved.node.name if reserved.node else None,
            "model": reserved.gpu_model or None,
            "gpus": sorted(gpu.pk for gpu in reserved.gpus.all()),
            "count": reserved.count,
            "start": occurrence.start.astimezone(UTC).isoformat(),
            "end": occurrence.end.astimezone(UTC).isoformat(),
            "release_at": occurrence.release_at.astimezone(UTC).isoformat() if occurrence.release_at else None,
        },
        "conflicts": [],
        **extra,
    }


def _gpus_refused(occurrence: ReservedOccurrence, hit: list[Gpu]) -> ReservedConflict:
    names = ", ".join(unit_name(unit) for unit in hit)
    verb = "is" if len(hit) == 1 else "are"
    return ReservedConflict(
        f"{names} on {occurrence.reserved.where} {verb} reserved for group {occurrence.reserved.group.name} "
        f"{describe_window(occurrence.start, occurrence.end)}: ask a member to book it, or book outside it.",
        **_details(occurrence, gpus=[unit.pk for unit in hit]),
    )


def _count_refused(
    occurrence: ReservedOccurrence, *, capacity: int, held: Fraction, asked: Fraction, allowed: int
) -> ReservedConflict:
    reserved = occurrence.reserved
    return ReservedConflict(
        f"{reserved.count} of the {capacity} GPUs of {reserved.where} are reserved for group "
        f"{reserved.group.name} {describe_window(occurrence.start, occurrence.end)}: others hold "
        f"{_number(held)} and ask {_number(asked)}, more than the {max(allowed, 0)} left to them. Ask a member "
        "to book it, or book outside it.",
        **_details(occurrence, held=float(held), asked=float(asked), allowed=max(allowed, 0)),
    )


def _number(value: Fraction) -> str:
    return str(int(value)) if value.denominator == 1 else f"{float(value):.2f}".rstrip("0").rstrip(".")


# --- what a non-member is offered (availability, "any N GPUs" bookings) ----------------------------


@dataclass(frozen=True)
class Restrictions:
    """What reserved capacity keeps from one person on some nodes over a range: the reserved units' places
    (card, memory slices [low, high), start, end), and the "any N" occurrences with their node."""

    places: list[tuple[int, int, int, datetime, datetime]]
    counted: list[ReservedOccurrence]


def restrictions_for(
    *, user: Any, nodes: Iterable[Node], start: datetime, end: datetime, now: datetime
) -> Restrictions:
    """The unreleased occurrences over [start, end) of groups ``user`` is not in (none for booking admins)."""
    if user is None or getattr(user, "is_booking_admin", False):
        return Restrictions([], [])
    groups = _group_ids(user) if getattr(user, "pk", None) else set()
    outside = [o for o in reserved_overlapping(start=start, end=end, now=now, nodes=nodes) if applies_to(o, groups)]
    places = [
        (gpu.card_id, *gpu.placement, o.start, o.end)
        for o in outside
        if o.reserved.count is None
        for gpu in o.reserved.gpus.all()
    ]
    return Restrictions(places, [o for o in outside if o.reserved.count is not None])


def room_left(*, node: Node, counted: Sequence[ReservedOccurrence], start: datetime, end: datetime) -> Fraction | None:
    """How many GPUs of ``node`` a non-member may still take over [start, end) under its "any N" occurrences
    (None: no such occurrence there). A count of a model applies on every node with the model, and is spent here
    by any unit the caller picks (``within_room``): on a node that also has other models, that is cautious."""
    room: Fraction | None = None
    for occurrence in counted:
        reserved = occurrence.reserved
        elsewhere = reserved.node_id is not None and reserved.node_id != node.pk
        if elsewhere or not (occurrence.start < end and occurrence.end > start):
            continue
        if reserved.gpu_model and not Gpu.objects.filter(node=node, model=reserved.gpu_model).exists():
            continue  # a count of a model this node does not have
        o_start, o_end = max(start, occurrence.start), min(end, occurrence.end)
        left = (
            capacity_of(reserved) - (reserved.count or 0) - others_peak(occurrence=occurrence, start=o_start, end=o_end)
        )
        room = left if room is None else min(room, left)
    return None if room is None else max(room, Fraction(0))


def within_room(units: Sequence[Gpu], room: Fraction | None) -> list[Gpu]:
    """The first of ``units`` whose shares add up to at most ``room`` (all of them when None)."""
    if room is None:
        return list(units)
    taken: list[Gpu] = []
    total = Fraction(0)
    for unit in units:
        share = unit.share_of(unit.parent)
        if total + share > room:
            break
        taken.append(unit)
        total += share
    return taken
