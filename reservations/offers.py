"""Offers: a slot held for one person until they take it or it passes on (the waitlist's, waitlist/).

An offer is a reservation with status OFFERED. Its allocations are active, so the database's no-overlap
rule keeps everyone else off the slot while it is offered, but it opens nothing on the node (leases take
approved bookings only) and is nobody's booking yet: the limits are checked when its person takes it
(``offer_accept``, under their lock, as for a new booking), and it becomes approved, or pending where the
node or their limits need an admin. Withdrawn (``offer_withdraw``: declined, lapsed, unfit), it is cancelled
with the reason, which frees the slot again for whoever waits next.

These functions know nothing of the waitlist: they hold, hand over and free slots; waitlist/ decides for whom.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from accounts.models import User
from nodes.models import Gpu
from reservations import selectors
from reservations.exceptions import InvalidState, NotAllowed
from reservations.limits import Period, check_limits, effective_limits
from reservations.models import Reservation
from reservations.reserved import check_reserved_capacity
from reservations.services import (
    _approval_required,
    _bookable_node,
    _booking_transaction,
    _cancel_locked,
    _changed,
    _check_slot_free,
    _clean_purpose,
    _gpu_ids,
    _load_gpus,
    _lock,
    _lock_booker,
    _share,
    _snapshot,
    _write_allocations,
)
from reservations.timegrid import format_moment

Status = Reservation.Status
_WEEK = timedelta(days=7)


def offer_create(
    *, user: User, gpus: Sequence[Gpu | int], start: datetime, end: datetime, purpose: str = "", now: datetime
) -> Reservation:
    """Hold [start, end) on ``gpus`` for ``user``, in the caller's transaction (a savepoint: a refusal leaves
    it usable). Refused exactly as a booking would be (slot taken, maintenance, a GPU that takes no
    bookings): the BookingError is raised and nothing is written. The caller holds no lock on the cards;
    the exclusion constraint is the wall, as it is behind every booking. Reserved capacity of a group
    ``user`` is not in refuses it as it refuses their booking (ReservedConflict; a count locks the node)."""
    with transaction.atomic():
        units = _load_gpus(_gpu_ids(gpus))
        node = _bookable_node(units)
        any_reserved = _check_slot_free(node=node, gpus=units, start=start, end=end)
        check_reserved_capacity(
            user=user, actor=user, node=node, gpus=units, start=start, end=end, now=now, any_reserved=any_reserved
        )
        offer = Reservation.objects.create(
            user=user,
            node=node,
            start=start,
            end=end,
            purpose=_clean_purpose(purpose),
            status=Status.OFFERED,
            created_by=None,
            created_at=now,
        )
        _write_allocations(offer, units)
    _changed(None, "offer", offer, before=None)
    return offer


def offer_accept(*, reservation: Reservation, actor: Any) -> Reservation:
    """Turn an offer into its person's booking, in its own transaction, locking the person and then the
    cards (the usual order), and checked as a new booking would be: the account active, the node and GPUs
    still taking bookings, no maintenance since, the limits (every other booking of theirs counts). The node
    or their limits may make it a pending booking, unless an admin takes it. Raises the BookingError (the
    offer stays: the caller withdraws it), InvalidState when it is no longer on offer."""
    gpu_ids = list(reservation.allocations.values_list("gpu_id", flat=True))
    with _booking_transaction():
        _lock_booker(reservation.user, gpu_ids)
        locked = _lock(reservation.pk)
        if actor is not None and actor.pk != locked.user_id and not actor.is_booking_admin:
            raise NotAllowed(f"Reservation #{locked.pk} is offered to someone else.")
        now = timezone.now()
        _require_on_offer(locked, now)
        units = list(Gpu.objects.select_related("node", "parent").filter(allocations__reservation=locked))
        node = _bookable_node(units)
        _check_slot_free(node=node, gpus=units, start=max(locked.start, now), end=locked.end, reservation=locked)
        limits = effective_limits(locked.user)
        # An admin's booking skips the limits and approval, as reservation_create's does: their own, or one they
        # take for someone.
        booker = actor if actor is not None else locked.user
        by_admin = locked.user.is_booking_admin or booker.is_booking_admin
        if not by_admin:
            offer_fits_limits(user=locked.user, units=units, start=locked.start, end=locked.end, now=now, offer=locked)
        before = _snapshot(locked)
        needs_approval = not booker.is_booking_admin and _approval_required(locked.node, limits)
        locked.status = Status.PENDING if needs_approval else Status.APPROVED
        locked.created_by = actor if getattr(actor, "pk", None) else locked.user
        locked.save(update_fields=["status", "created_by"])
        _changed(actor, "claim", locked, before, mail_verb="create")
    return locked


def offer_withdraw(*, reservation: Reservation, actor: Any, reason: str) -> Reservation:
    """Take an offer back (declined, lapsed, or its person can no longer take it): it is cancelled with
    ``reason`` and its slot is free again, in this transaction."""
    with _booking_transaction():
        locked = _lock(reservation.pk)
        if actor is not None and actor.pk != locked.user_id and not actor.is_booking_admin:
            raise NotAllowed(f"Reservation #{locked.pk} is offered to someone else.")
        if locked.status != Status.OFFERED:
            raise InvalidState(
                f"Reservation #{locked.pk} is {locked.get_status_display().lower()}, not on offer.",
                status=locked.status,
            )
        _cancel_locked(locked, actor=actor, now=timezone.now(), reason=reason)
    return locked


def offer_fits_limits(
    *, user: User, units: list[Gpu], start: datetime, end: datetime, now: datetime, offer: Reservation | None = None
) -> None:
    """Raise LimitExceeded if ``user`` taking ``units`` over [start, end) (from now, if it has begun) would
    break their limits: their other bookings and offers count, ``offer`` itself not."""
    limits = effective_limits(user)
    start = max(start, now)
    held = (
        selectors.held_periods(
            user=user, start=start - _WEEK, end=end + _WEEK, exclude_reservation_id=offer.pk if offer else None
        )
        if limits.counts_usage
        else []
    )
    check_limits(limits=limits, slot=(start, end), asked=Period(start, end, _share(units)), held=held, now=now)


def _require_on_offer(reservation: Reservation, now: datetime) -> None:
    if reservation.status != Status.OFFERED:
        raise InvalidState(
            f"Reservation #{reservation.pk} is {reservation.get_status_display().lower()}, not on offer.",
            status=reservation.status,
        )
    if reservation.end <= now:
        raise InvalidState(f"The offer of reservation #{reservation.pk} ended at {format_moment(reservation.end)}.")
