"""Reads of the booking domain. Views, services and tasks get their querysets here."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from fractions import Fraction
from typing import NamedTuple

from django.db.models import Exists, OuterRef, Prefetch, Q, QuerySet, Subquery, prefetch_related_objects
from django.utils import timezone

from accounts.models import User
from nodes.models import BOOKABLE_GPUS, Gpu, Node, card_share
from reservations.limits import Period
from reservations.models import Allocation, MaintenanceWindow, Reservation
from reservations.reserved import restrictions_for, room_left, within_room


class Place(NamedTuple):
    """A part of a card (memory slices [low, high)) taken over [start, end)."""

    card_id: int
    low: int
    high: int
    start: datetime
    end: datetime

    def shares_part(self, low: int, high: int) -> bool:
        """Whether the place overlaps memory slices [low, high) of its card: a unit's part (Gpu.placement)."""
        return self.low < high and low < self.high


def allocations_overlapping(
    *, gpus: Sequence[Gpu], start: datetime, end: datetime, exclude_reservation_id: int | None = None
) -> QuerySet[Allocation]:
    """Active allocations that overlap [start, end) on a part of a card these units occupy — the slots a
    booking would hit: the same GPU, a slice of a card asked for whole, the card of a slice asked for,
    or another slice sharing its memory slices (the PostgreSQL constraint's rule, asked first)."""
    same_place = Q(pk__in=[])
    for gpu in gpus:
        low, high = gpu.placement
        same_place |= Q(card_id=gpu.card_id, placement_start__lt=high, placement_end__gt=low)
    qs = Allocation.objects.filter(same_place, active=True, start__lt=end, end__gt=start).select_related(
        "reservation__user", "gpu__node"
    )
    if exclude_reservation_id is not None:
        qs = qs.exclude(reservation_id=exclude_reservation_id)
    return qs.order_by("start", "gpu__index", "placement_start")


def maintenance_overlapping(
    *, node: Node, gpus: Sequence[Gpu], start: datetime, end: datetime
) -> QuerySet[MaintenanceWindow]:
    """Maintenance windows of the whole node, or of one of these GPUs (a slice's card counts: maintenance
    of a card stops its slices), that overlap [start, end)."""
    units = {gpu.pk for gpu in gpus} | {gpu.card_id for gpu in gpus}
    return (
        MaintenanceWindow.objects.filter(node=node, start__lt=end, end__gt=start)
        .filter(Q(gpu__isnull=True) | Q(gpu__in=units))
        .select_related("node", "gpu__node")
        .order_by("start")
    )


def held_periods(
    *, user: User, start: datetime, end: datetime, exclude_reservation_id: int | None = None
) -> list[Period]:
    """The user's live bookings overlapping [start, end), one Period per reservation, counting each
    unit by its share of a card (a 3g.40gb slice of a 7-slice card is 3/7 GPU)."""
    qs = Allocation.objects.filter(active=True, reservation__user=user, start__lt=end, end__gt=start)
    if exclude_reservation_id is not None:
        qs = qs.exclude(reservation_id=exclude_reservation_id)
    rows = qs.values_list(
        "reservation_id", "start", "end", "gpu__compute_slices", "gpu__parent__compute_slices"
    ).order_by()
    held: dict[tuple[int, datetime, datetime], Fraction] = {}
    for reservation_id, row_start, row_end, slices, card_slices in rows:
        share = card_share(slices, card_slices)  # a card has no parent: card_slices None, share 1
        key = (reservation_id, row_start, row_end)
        held[key] = held.get(key, Fraction(0)) + share
    return [Period(row_start, row_end, gpus) for (_, row_start, row_end), gpus in held.items()]


def reservation_for_update(reservation_id: int) -> Reservation:
    """The reservation, row-locked for the rest of the transaction (a no-op lock on SQLite)."""
    return Reservation.objects.select_for_update(of=("self",)).select_related("user", "node").get(pk=reservation_id)


def pending_extension(reservation: Reservation) -> Reservation | None:
    """The undecided extension of ``reservation`` (there is at most one), or None. Uses the
    ``pending_extensions`` that ``reservation_list`` prefetches when it is there."""
    prefetched = getattr(reservation, "pending_extensions", None)
    if prefetched is not None:
        return prefetched[0] if prefetched else None
    return reservation.extensions.filter(status=Reservation.Status.PENDING).order_by("pk").first()


# A reservation's GPUs, with their allocations in one query (the serializer and the pages read both).
ALLOCATIONS = Prefetch("allocations", queryset=Allocation.objects.select_related("gpu"))


def reservation_list(*, user: User) -> QuerySet[Reservation]:
    """What ``user`` may see: admins everything; researchers their own reservations and everyone
    else's live ones (shown as busy slots by the serializer)."""
    qs = (
        Reservation.objects.select_related("user", "node", "decided_by", "extends")
        .prefetch_related(ALLOCATIONS)
        .prefetch_related(
            Prefetch(
                "extensions",
                queryset=Reservation.objects.filter(status=Reservation.Status.PENDING).order_by("pk"),
                to_attr="pending_extensions",
            )
        )
    )
    if not user.is_booking_admin:
        qs = qs.filter(Q(user=user) | Q(status__in=Reservation.LIVE_STATUSES))
    return qs.order_by("start", "id")


def booking_as_made(reservation: Reservation) -> Reservation:
    """A booking ``reservation_create`` has just returned, with what ``reservation_list`` would load for it,
    in one query: its person and node are the objects it was made with, its GPUs are read with their
    allocations, and it has no extension yet. Reading it again through ``reservation_list`` costs four."""
    prefetch_related_objects([reservation], ALLOCATIONS)
    reservation.pending_extensions = []  # type: ignore[attr-defined]  # as reservation_list's Prefetch(to_attr=...)
    return reservation


def reservations_actionable(*, user: User) -> QuerySet[Reservation]:
    """The reservations ``user`` may act on (others' answer 404)."""
    qs = reservation_list(user=user)
    return qs if user.is_booking_admin else qs.filter(user=user)


def bookable_units(*, profile: str = "") -> QuerySet[Gpu]:
    """What takes bookings now: whole cards (``profile`` empty), or the MIG slices of one profile.

    A card in MIG mode is booked as all its slices, so it counts only while every present slice of it is
    confirmed; a slice only while its card is in MIG mode and itself bookable."""
    if profile:
        return Gpu.objects.filter(
            BOOKABLE_GPUS,
            profile=profile,
            gone_at__isnull=True,
            parent__mig_mode=True,
            parent__bookable=True,
            parent__drained_at__isnull=True,
            parent__mig_change_at__isnull=True,
        )
    present = Gpu.objects.filter(parent=OuterRef("pk"), gone_at__isnull=True)
    return Gpu.objects.filter(BOOKABLE_GPUS, parent__isnull=True).exclude(
        Q(mig_mode=True) & (~Exists(present) | Exists(present.filter(bookable=False)))
    )


def taken_places(*, node_ids: Iterable[int], start: datetime, end: datetime) -> list[Place]:
    """What is taken on these nodes' cards over [start, end): live allocations and GPU maintenance, as
    (card, placement) with their period. A unit is free when no place of its card overlaps its own."""
    places = [
        Place(*row)
        for row in Allocation.objects.filter(
            active=True, card__node__in=list(node_ids), start__lt=end, end__gt=start
        ).values_list("card_id", "placement_start", "placement_end", "start", "end")
    ]
    windows = MaintenanceWindow.objects.filter(node__in=list(node_ids), gpu__isnull=False, start__lt=end, end__gt=start)
    for window in windows.select_related("gpu"):
        if window.gpu is None:  # not asked for (gpu__isnull=False): says so to the type checker
            continue
        low, high = window.gpu.placement
        places.append(Place(window.gpu.card_id, low, high, window.start, window.end))
    return places


def is_free(unit: Gpu, places: Iterable[Place], start: datetime, end: datetime) -> bool:
    """Whether no taken place of ``unit``'s card overlaps the unit's own placement within [start, end)."""
    low, high = unit.placement
    card_id = unit.card_id  # a property: read once, not once per place
    for place in places:
        same_part = place.card_id == card_id and place.shares_part(low, high)
        if same_part and place.start < end and start < place.end:
            return False
    return True


def free_gpus(
    *,
    node: Node,
    count: int,
    start: datetime,
    end: datetime,
    profile: str = "",
    user: User | None = None,
    now: datetime | None = None,
) -> list[Gpu]:
    """The first ``count`` bookable units of ``node`` (cards, or slices of ``profile``; by index) free over
    [start, end), or fewer. For ``user``, reserved capacity of groups they are not in counts as taken
    (reserved GPUs; at most the node's GPUs minus N under "any N GPUs")."""
    places = taken_places(node_ids=[node.pk], start=start, end=end)
    kept = restrictions_for(user=user, nodes=[node], start=start, end=end, now=now or timezone.now())
    places += [Place(*place) for place in kept.places]
    units = bookable_units(profile=profile).filter(node=node).select_related("node", "parent")
    free = [unit for unit in units.order_by("index", "placement_start") if is_free(unit, places, start, end)]
    return within_room(free, room_left(node=node, counted=kept.counted, start=start, end=end))[:count]


def gpu_list(
    *, now: datetime, node: str | None = None, model: str | None = None, min_memory_mib: int | None = None
) -> QuerySet[Gpu]:
    """GPUs with their current holder and next booking, in one query whatever the data size
    (each annotation is an index-backed subquery on the active allocations)."""
    qs = Gpu.objects.select_related("node")
    if node:
        qs = qs.filter(node__name=node)
    if model:
        qs = qs.filter(model__icontains=model)
    if min_memory_mib is not None:
        qs = qs.filter(memory_mib__gte=min_memory_mib)

    live = Allocation.objects.filter(gpu=OuterRef("pk"), active=True)
    current = live.filter(start__lte=now, end__gt=now).order_by("start")
    upcoming = live.filter(start__gt=now).order_by("start")
    annotations: dict[str, Subquery] = {}
    for prefix, source in (("current", current), ("next", upcoming)):
        annotations |= {
            f"{prefix}_reservation": Subquery(source.values("reservation_id")[:1]),
            f"{prefix}_user": Subquery(source.values("reservation__user__username")[:1]),
            f"{prefix}_start": Subquery(source.values("start")[:1]),
            f"{prefix}_end": Subquery(source.values("end")[:1]),
        }
    return qs.annotate(**annotations).order_by("node__name", "index")
