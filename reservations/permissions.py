"""Which actions a person may take on a booking now: the buttons every page offers.

The services decide (``reservations.services`` raises NotAllowed or InvalidState, with words); this
mirrors their checks so that the calendar, My reservations and the booking's page offer the same
buttons and only those the services would accept. Change a rule in both places.
"""

from __future__ import annotations

from datetime import datetime
from functools import lru_cache
from typing import Any

from reservations.models import Reservation

Status = Reservation.Status
LIVE = frozenset(Reservation.LIVE_STATUSES)


@lru_cache(maxsize=256)  # a few dozen combinations; the calendar asks once per booking
def allowed_actions(
    *,
    owner: bool,
    admin: bool,
    status: str,
    is_request: bool,
    started: bool,
    ended: bool,
    extension_waiting: bool = False,
) -> frozenset[str]:
    """The actions ("cancel", "release", "extend", "approve", "reject") allowed now.

    ``is_request``: the booking is an extension waiting for approval. ``extension_waiting``: an
    extension of this booking waits for approval (another cannot be asked for meanwhile; the calendar,
    which does not look, leaves it False and the service's refusal names the waiting one).
    """
    allowed = set()
    if admin and status == Status.PENDING:
        allowed.add("reject")  # even once its time has passed: a decision closes it
        if not ended:
            allowed.add("approve")
    if (owner or admin) and status in LIVE and not ended:
        # Once started, a booking is released, not cancelled; an admin may still cancel it, and an
        # undecided extension request is withdrawn (cancelled) whenever its owner likes.
        if not started or admin or is_request:
            allowed.add("cancel")
        if started and not is_request:
            allowed.add("release")
        # One waiting for approval is never lengthened: the admin approves what they saw (an extension
        # request included; the service's refusal says to withdraw it and ask again).
        if status == Status.APPROVED and not extension_waiting:
            allowed.add("extend")
    return frozenset(allowed)


def reservation_actions(
    *, reservation: Reservation, viewer: Any, now: datetime, extension_waiting: bool
) -> frozenset[str]:
    """``allowed_actions`` for a loaded reservation and the person looking at it."""
    return allowed_actions(
        owner=reservation.user_id == viewer.pk,
        admin=viewer.is_booking_admin,
        status=reservation.status,
        is_request=reservation.extends_id is not None and reservation.status == Status.PENDING,
        started=reservation.start <= now,
        ended=reservation.end <= now,
        extension_waiting=extension_waiting,
    )
