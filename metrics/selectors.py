"""The reads /metrics adds to the status cards (reservations.fleet.fleet_status): one query each, whatever
the fleet's size."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db.models import Count, Min, Q

from nodes.models import Node
from reservations.models import Reservation

PHASES = ("running", "upcoming")


@dataclass(frozen=True)
class Bookings:
    # (status, phase) -> how many live bookings (pending or approved) have not ended yet.
    live: dict[tuple[str, str], int]
    oldest_pending_created_at: datetime | None

    @property
    def pending(self) -> int:
        return sum(count for (status, _phase), count in self.live.items() if status == Reservation.Status.PENDING)


def booking_counts(*, now: datetime) -> Bookings:
    """Bookings that are running or still to come, by status and phase; and the oldest one still
    waiting for an admin (a pending booking can be decided until it ends)."""
    phase = {"running": Q(start__lte=now), "upcoming": Q(start__gt=now)}
    counts = {
        f"{status}_{name}": Count("pk", filter=Q(status=status) & condition)
        for status in Reservation.LIVE_STATUSES
        for name, condition in phase.items()
    }
    row = Reservation.objects.filter(status__in=Reservation.LIVE_STATUSES, end__gt=now).aggregate(
        **counts, oldest_pending=Min("created_at", filter=Q(status=Reservation.Status.PENDING))
    )
    return Bookings(
        live={(str(status), name): row[f"{status}_{name}"] for status in Reservation.LIVE_STATUSES for name in PHASES},
        oldest_pending_created_at=row["oldest_pending"],
    )


def lease_versions() -> dict[str, int]:
    """Node name -> the version of the latest lease snapshot the portal made for it."""
    return dict(Node.objects.values_list("name", "lease_version"))
