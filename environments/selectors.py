"""Reading launches: what a node is asked to run, and what a person may see."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from django.db.models import QuerySet

from environments.models import Environment, Launch
from gpubook_agent import protocol
from nodes.models import NodeEvent
from reservations.models import Reservation

GIB = 1024**3
LAUNCH_EVENTS = (
    NodeEvent.Kind.LAUNCH_STARTED,
    NodeEvent.Kind.LAUNCH_EXITED,
    NodeEvent.Kind.LAUNCH_STOPPED,
    NodeEvent.Kind.LAUNCH_REFUSED,
)
ID_RE = re.compile(r"[0-9]{1,18}")  # an id as a form or a query gives it: ASCII digits only ("²" is a digit too)


def lease_launches(*, reservation_ids: Iterable[int], now: datetime) -> Mapping[int, list[protocol.LaunchRequest]]:
    """Per reservation, the launches its node should run: asked for, not stopped, not over. (Registered with
    reservations.leases: they travel signed in the node's snapshot.)"""
    requested: dict[int, list[protocol.LaunchRequest]] = {}
    rows = (
        Launch.objects.filter(
            reservation_id__in=list(reservation_ids), state__in=Launch.OPEN_STATES, stop_requested_at=None
        )
        .select_related("environment")
        .order_by("reservation_id", "number")
    )
    for launch in rows:
        requested.setdefault(launch.reservation_id, []).append(launch_request(launch))
    return requested


def launch_request(launch: Launch) -> protocol.LaunchRequest:
    environment = launch.environment
    return protocol.launch_request(
        number=launch.number,
        kind=environment.kind,
        image=environment.image if environment.kind == Environment.Kind.CONTAINER else "",
        argv=environment.command,
        memory_max_bytes=environment.memory_max_gb * GIB if environment.memory_max_gb else None,
        max_processes=environment.max_processes,
    )


def launches_visible(*, user: Any) -> QuerySet[Launch]:
    """The launches ``user`` may see: those of their own bookings, everyone's for a booking admin."""
    launches = Launch.objects.select_related("environment", "reservation__node", "reservation__user")
    return launches if user.is_booking_admin else launches.filter(reservation__user=user)


def environments_offered() -> QuerySet[Environment]:
    return Environment.objects.filter(enabled=True).order_by("name")


def booking_launches(*, reservation: Reservation) -> list[Launch]:
    return list(reservation.launches.select_related("environment").order_by("number"))


def launch_events(*, reservation: Reservation, limit: int = 50) -> list[NodeEvent]:
    """What the booking's node reported of its launches, oldest first."""
    events = NodeEvent.objects.filter(
        node_id=reservation.node_id, reservation_id=reservation.pk, kind__in=LAUNCH_EVENTS
    ).order_by("at", "pk")
    return list(events[:limit])
