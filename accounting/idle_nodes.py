"""Fully idle node-hours: the time in a period, up to now, when no booking held any GPU of a node (a whole
node under maintenance counts as held: it is out of service, not idle). These are the hours a power cap on
idle cards (Node.idle_power_limit_pct) saves on and packing (AVAILABILITY_PACK_NODES) makes longer; a booking
admin's report shows them per node and for the fleet.

Every node the portal knows counts over the whole period. The periods held come ordered per node from one
query each for bookings and maintenance (bookings of several GPUs with the same times come once) and are
merged here.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta

from nodes.models import Node
from reservations.models import Allocation, MaintenanceWindow, Reservation


def idle_node_hours(*, start: datetime, end: datetime, now: datetime) -> dict[int, float]:
    """Each node's hours in [start, min(end, now)) with nothing held on it."""
    until = max(start, min(end, now))
    held: dict[int, list[tuple[datetime, datetime]]] = defaultdict(list)
    bookings = Allocation.objects.filter(
        active=True, reservation__status=Reservation.Status.APPROVED, start__lt=until, end__gt=start
    ).values_list("gpu__node_id", "start", "end")
    maintenance = MaintenanceWindow.objects.filter(gpu__isnull=True, start__lt=until, end__gt=start).values_list(
        "node_id", "start", "end"
    )
    for periods in (bookings.distinct().order_by(), maintenance):
        for node_id, held_from, held_until in periods:
            held[node_id].append((max(held_from, start), min(held_until, until)))
    span = until - start
    return {node_id: _hours(span - _covered(held[node_id])) for node_id in Node.objects.values_list("pk", flat=True)}


def _covered(periods: list[tuple[datetime, datetime]]) -> timedelta:
    """How long the union of ``periods`` lasts."""
    total = timedelta()
    reach: datetime | None = None
    for begin, finish in sorted(periods):
        if reach is None or begin > reach:
            total += finish - begin
            reach = finish
        elif finish > reach:
            total += finish - reach
            reach = finish
    return total


def _hours(length: timedelta) -> float:
    return length.total_seconds() / 3600
