"""What reservations does when a booking changes (its own announcement: the audit record and the lease
push) and when accounts announce a change (accounts/signals.py)."""

from __future__ import annotations

import logging
from typing import Any

from django.dispatch import receiver
from django.utils import timezone

from accounts.models import User
from accounts.signals import unix_username_changed, user_deactivated
from audit.services import audit_record
from nodes.models import Node
from nodes.signals import node_power_policy_changed
from reservations import services
from reservations.freed import announce_freed_by
from reservations.models import Allocation, Reservation
from reservations.pushes import request_push
from reservations.signals import reservation_changed

logger = logging.getLogger(__name__)

DEACTIVATED = "the account was deactivated"


@receiver(reservation_changed.in_transaction)
def audit_booking_change(
    sender: type, reservation: Reservation, verb: str, actor: Any, before: Any, after: Any, reason: str, **kwargs: Any
) -> None:
    """Every change of a booking leaves its audit record, committed with it."""
    audit_record(
        actor=actor, action=f"reservation.{verb}", target=reservation, before=before, after=after, reason=reason
    )


@receiver(reservation_changed.in_transaction)
def announce_freed_capacity(
    sender: type, reservation: Reservation, verb: str, before: Any, after: Any, **kwargs: Any
) -> None:
    """Time a change freed is announced (reservations/freed.py), for the waitlist to offer in this transaction."""
    announce_freed_by(reservation, verb=verb, before=before, after=after)


@receiver(reservation_changed.on_commit)
def push_node_leases(sender: type, reservation: Reservation, **kwargs: Any) -> None:
    """The node hears of every committed change to its bookings (coalesced: reservations/pushes.py)."""
    request_push(reservation.node_id)


@receiver(node_power_policy_changed.on_commit)
def push_node_power_policy(sender: type, node: Node, **kwargs: Any) -> None:
    """An admin changed the node's idle power cap: its agent gets it with a snapshot now (coalesced)."""
    request_push(node.pk)


@receiver(user_deactivated)
def end_bookings_of_deactivated_user(sender: type, user_id: int, **kwargs: Any) -> None:
    """Runs after the deactivation committed. The leases leave the person out from now on
    (reservations.leases); their nodes hear it at once, then the bookings are ended for the record. A
    failure here is logged: beat's sweep (reservations.end_inactive_bookings) finishes the job."""
    _push_nodes_of(user_id)
    user = User.objects.filter(pk=user_id, is_active=False).first()
    if user is None:
        return
    try:
        services.reservations_end_for_inactive_user(user=user, reason=DEACTIVATED)
    except Exception:
        logger.exception("bookings of deactivated user %s not ended yet; beat's sweep will", user_id)


@receiver(unix_username_changed)
def push_nodes_of_renamed_user(sender: type, user_id: int, **kwargs: Any) -> None:
    """The account that receives the person's GPUs changed: their nodes get the new leases."""
    _push_nodes_of(user_id)


def _push_nodes_of(user_id: int) -> None:
    node_ids = (
        Allocation.objects.filter(
            active=True,
            reservation__user_id=user_id,
            reservation__status=Reservation.Status.APPROVED,
            end__gt=timezone.now(),
        )
        .values_list("gpu__node_id", flat=True)
        .distinct()
    )
    for node_id in sorted(set(node_ids)):
        request_push(node_id)
