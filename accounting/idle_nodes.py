"""Fully idle node-hours: the time in a period, up to now, when no booking held any GPU of a node (a whole
node's maintenance window counts as held: it is out of service, not idle). These are the hours a power cap on
idle cards (Node.idle_power_limit_pct) saves on and packing (AVAILABILITY_PACK_NODES) makes longer; a booking
admin's report shows them per node and for the fleet.

Each active node counts over the whole period; a node disabled or under maintenance now is out of service,
not idle, and counts not at all (the portal keeps no history of a node's status). On PostgreSQL the database
merges the periods held (``range_agg``: a year of 100 GPUs is 100,000 bookings, and reading them out took a
second); elsewhere they are read, bookings of several GPUs with the same times once, and merged here.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import connection
from django.db.models import QuerySet

from nodes.models import Node
from reservations.models import Allocation, MaintenanceWindow, Reservation


@dataclass(frozen=True)
class IdleNodes:
    span_hours: float  # the period up to now: each node's hours in it
    idle: dict[int, float]  # each active node's hours in it with nothing held on it

    @property
    def node_hours(self) -> float:
        return self.span_hours * len(self.idle)

    @property
    def idle_node_hours(self) -> float:
        return sum(self.idle.values())


def idle_node_hours(*, start: datetime, end: datetime, now: datetime) -> IdleNodes:
    """The active nodes' hours in [start, min(end, now)) with nothing held on them."""
    until = max(start, min(end, now))
    bookings = Allocation.objects.filter(
        active=True, reservation__status=Reservation.Status.APPROVED, start__lt=until, end__gt=start
    ).values_list("gpu__node_id", "start", "end")
    maintenance = MaintenanceWindow.objects.filter(gpu__isnull=True, start__lt=until, end__gt=start).values_list(
        "node_id", "start", "end"
    )
    if connection.vendor == "postgresql":
        covered = _covered_in_database(bookings.order_by(), maintenance.order_by(), start=start, until=until)
    else:
        held: dict[int, list[tuple[datetime, datetime]]] = defaultdict(list)
        for periods in (bookings.distinct().order_by(), maintenance):
            for node_id, held_from, held_until in periods:
                held[node_id].append((max(held_from, start), min(held_until, until)))
        covered = {node_id: _covered(periods) for node_id, periods in held.items()}
    span = until - start
    active = Node.objects.filter(status=Node.Status.ACTIVE).values_list("pk", flat=True)
    return IdleNodes(
        span_hours=_hours(span), idle={node_id: _hours(span - covered.get(node_id, timedelta())) for node_id in active}
    )


def _covered_in_database(*held: QuerySet[Any], start: datetime, until: datetime) -> dict[int, timedelta]:
    """How long the union of the (node, start, end) rows of ``held`` lasts per node, within [start, until)."""
    parts = [queryset.query.sql_with_params() for queryset in held]
    rows = " UNION ALL ".join(f"({sql})" for sql, _ in parts)
    # The rows' SQL is the ORM's own, their values parameters: nothing from outside is written into the text.
    sql = (
        "SELECT node_id, SUM(upper(piece) - lower(piece)) FROM ("  # noqa: S608
        " SELECT node_id, unnest(range_agg(tstzrange(GREATEST(held_from, %s), LEAST(held_until, %s)))) AS piece"
        f" FROM ({rows}) AS held (node_id, held_from, held_until) GROUP BY node_id"
        ") AS pieces GROUP BY node_id"
    )
    params = [start, until, *(param for _, part_params in parts for param in part_params)]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return dict(cursor.fetchall())


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
