"""How environments react to what the layers below announce."""

from __future__ import annotations

from typing import Any

from django.dispatch import receiver
from django.utils import timezone

from environments.services import launches_end_with_booking, launches_record
from nodes.models import Node
from nodes.signals import node_reported
from reservations.models import Reservation
from reservations.signals import reservation_changed


@receiver(node_reported.in_transaction)
def record_launches(
    sender: type, node: Node, now: Any, launches: list[dict[str, Any]] | None = None, **kwargs: Any
) -> None:
    """A heartbeat brings the node's word on its launches: their state, output and connection."""
    if launches:
        launches_record(node=node, statuses=launches, now=now)


@receiver(reservation_changed.in_transaction)
def end_unstarted_launches(sender: type, reservation: Reservation, **kwargs: Any) -> None:
    """A booking cancelled, rejected or cut short before its launches started: they never will. (Running ones end
    on the node, which says so in its next heartbeat.)"""
    now = timezone.now()
    if not reservation.is_live or reservation.end <= now:
        launches_end_with_booking(reservation=reservation, now=now)
