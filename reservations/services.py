"""Every change to a reservation goes through these functions.

Views, the API, admin actions and tasks call them; none of them repeats a rule. Each function
runs in its own transaction and writes one audit entry. The booking rules are described in
docs/booking-rules.md.

Concurrency: PostgreSQL has the exclusion constraint as the wall; in front of it each booking
transaction locks the booking user's row and then the GPUs' rows in id order, so the check below
sees every committed booking and two bookings of one GPU (or two of one user, for the limits)
queue up instead of racing. On SQLite the transaction itself is the lock (BEGIN IMMEDIATE).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from fractions import Fraction
from typing import Any

from django.conf import settings
from django.db import IntegrityError, OperationalError, connection, transaction
from django.db.models import F
from django.utils import timezone

from accounts.models import User
from accounts.services import who_sets_unix_usernames
from audit.services import audit_record
from nodes.models import Gpu, Node
from reservations import booking_sql, selectors
from reservations.exceptions import (
    BookingBusy,
    InvalidBooking,
    InvalidState,
    MaintenanceConflict,
    NotAllowed,
    SlotConflict,
)
from reservations.limits import EffectiveLimits, Period, check_limits, effective_limits
from reservations.models import Allocation, Reservation
from reservations.reserved import check_reserved_capacity
from reservations.signals import reservation_changed
from reservations.timegrid import ceil_to_grid, floor_to_grid, format_moment, format_period, require_in_calendar

Status = Reservation.Status


# --- public operations ---------------------------------------------------------------------


def reservation_create(
    *,
    user: User,
    gpus: Sequence[Gpu | int],
    start: datetime,
    end: datetime,
    purpose: str = "",
    actor: Any | None = None,
) -> Reservation:
    """Book ``gpus`` (all on one node) for ``user`` over [start, end), snapped to the grid.

    ``actor`` is who asks (defaults to the user); only admins may book for someone else, and an
    admin's booking skips the limits and approval.
    """
    actor = actor or user
    _require_may_book(user, actor)
    gpu_ids = _gpu_ids(gpus)
    now = timezone.now()
    start, end = _snap_slot(start, end, now)
    purpose = _clean_purpose(purpose)

    with _booking_transaction():
        booked_gpus = _lock_booker_and_load(user, gpu_ids)
        node = _bookable_node(booked_gpus)
        limits = effective_limits(user)
        _check_booking(
            user=user, actor=actor, node=node, gpus=booked_gpus, limits=limits, start=start, end=end, now=now
        )
        reservation = _create_booking(
            user=user,
            actor=actor,
            node=node,
            gpus=booked_gpus,
            limits=limits,
            start=start,
            end=end,
            purpose=purpose,
            now=now,
            alone=True,
        )
    return reservation


def reservation_approve(*, reservation: Reservation, actor: Any, reason: str = "") -> Reservation:
    """Approve a pending booking; a pending extension is merged into the booking it extends,
    which is returned."""
    _require_admin(actor, "approve bookings")
    if reservation.extends_id is not None:
        return _approve_extension(reservation, booking_id=reservation.extends_id, actor=actor, reason=reason)
    with _booking_transaction():
        locked = _lock(reservation.pk)
        _require_status(locked, (Status.PENDING,), "approved")
        now = timezone.now()
        if locked.end <= now:
            raise InvalidState(f"Reservation #{locked.pk} ended at {format_moment(locked.end)}: nothing to approve.")
        before = _snapshot(locked)
        locked.status = Status.APPROVED
        locked.decided_by, locked.decided_at, locked.decision_reason = actor, now, reason.strip()
        locked.save(update_fields=["status", "decided_by", "decided_at", "decision_reason"])
        _changed(actor, "approve", locked, before, reason=locked.decision_reason)
    return locked


def reservation_reject(*, reservation: Reservation, actor: Any, reason: str) -> Reservation:
    _require_admin(actor, "reject bookings")
    reason = (reason or "").strip()
    if not reason:
        raise InvalidBooking("Give a reason for the rejection: the researcher will read it.", field="reason")
    with _booking_transaction():
        locked = _lock(reservation.pk)
        _require_status(locked, (Status.PENDING,), "rejected")
        before = _snapshot(locked)
        locked.status = Status.REJECTED
        locked.decided_by, locked.decided_at, locked.decision_reason = actor, timezone.now(), reason
        locked.save(update_fields=["status", "decided_by", "decided_at", "decision_reason"])
        locked.allocations.update(active=False)
        _changed(actor, "reject", locked, before, reason=reason)
    return locked


def reservation_cancel(*, reservation: Reservation, actor: Any, reason: str = "") -> Reservation:
    """Cancel a booking. Its owner may cancel before the start; admins at any time."""
    with _booking_transaction():
        locked = _lock(reservation.pk)
        _require_owner_or_admin(actor, locked, "cancel")
        _require_status(locked, Reservation.LIVE_STATUSES, "cancelled")
        now = timezone.now()
        if locked.end <= now:
            raise InvalidState(f"Reservation #{locked.pk} is already over ({format_moment(locked.end)}).")
        # A pending extension is a request: its owner may withdraw it whenever it is undecided.
        withdrawing = locked.extends_id is not None and locked.status == Status.PENDING
        if locked.start <= now and not actor.is_booking_admin and not withdrawing:
            raise InvalidState(
                f"Reservation #{locked.pk} started at {format_moment(locked.start)}: release it to end it now.",
                hint="release",
            )
        _cancel_locked(locked, actor=actor, now=now, reason=(reason or "").strip())
        _cancel_pending_extensions(locked, actor=actor, now=now, reason=f"reservation #{locked.pk} was cancelled")
    return locked


def reservation_release(*, reservation: Reservation, actor: Any) -> Reservation:
    """End a running slot now; the rest of it is freed for others."""
    with _booking_transaction():
        locked = _lock(reservation.pk)
        _require_owner_or_admin(actor, locked, "release")
        _require_status(locked, Reservation.LIVE_STATUSES, "released")
        now = timezone.now()
        if now < locked.start:
            raise InvalidState(
                f"Reservation #{locked.pk} starts at {format_moment(locked.start)}: cancel it instead.",
                hint="cancel",
            )
        if locked.end <= now:
            raise InvalidState(f"Reservation #{locked.pk} already ended at {format_moment(locked.end)}.")
        if locked.extends_id is not None and locked.status == Status.PENDING:
            raise InvalidState(
                f"Reservation #{locked.pk} is an extension waiting for approval: withdraw it (cancel) instead.",
                hint="cancel",
            )
        _cancel_pending_extensions(locked, actor=actor, now=now, reason=f"reservation #{locked.pk} was released")
        before = _snapshot(locked)
        _end_now(locked, now)
        _changed(actor, "release", locked, before)
    return locked


def reservation_extend(*, reservation: Reservation, actor: Any, end: datetime) -> Reservation:
    """Move the end later. The added time passes every check a new booking would.

    Where a new booking would wait for an admin (the node or the owner's limits require approval),
    so does the added time: it becomes a pending extension, a reservation of its own that
    ``extends`` this one, holds the slot and opens nothing until an admin approves it; the approved
    part stays approved and enforced. The booking is returned either way (look for its pending
    extension with ``selectors.pending_extension``).

    A booking still waiting for approval, or an extension request, is never lengthened: the admin
    approves what they saw (docs/booking-rules.md, "Extending").
    """
    _require_aware(end, "end")
    new_end = ceil_to_grid(end)
    current = Reservation.objects.filter(pk=reservation.pk).first()
    if current is None:  # an extension approved meanwhile
        raise _merged_meanwhile(reservation.pk)
    gpu_ids = list(current.allocations.values_list("gpu_id", flat=True))
    with _booking_transaction():
        _lock_booking_rows(user_id=current.user_id, gpu_ids=gpu_ids)
        locked = _lock(reservation.pk)
        _require_owner_or_admin(actor, locked, "extend")
        _require_status(locked, Reservation.LIVE_STATUSES, "extended")
        _require_decided(locked)
        now = timezone.now()
        if locked.end <= now:
            raise InvalidState(
                f"Reservation #{locked.pk} already ended at {format_moment(locked.end)}: book a new slot."
            )
        if new_end <= locked.end:
            raise InvalidBooking(
                f"The new end ({format_moment(new_end)}) must be after the current end ({format_moment(locked.end)}).",
                field="end",
            )
        waiting = selectors.pending_extension(locked)
        if waiting is not None:
            raise InvalidState(
                f"Reservation #{locked.pk} already has an extension until {format_moment(waiting.end)} waiting for "
                f"approval (#{waiting.pk}): wait for the decision, or withdraw it and ask again.",
                extension=waiting.pk,
            )
        gpus = _load_gpus(gpu_ids)
        _bookable_node(gpus)
        any_reserved = _check_slot_free(node=locked.node, gpus=gpus, start=locked.end, end=new_end, reservation=locked)
        # The added time as a booking of its own: reserved capacity of a group the owner is not in refuses it.
        check_reserved_capacity(
            user=locked.user,
            actor=actor,
            node=locked.node,
            gpus=gpus,
            start=locked.end,
            end=new_end,
            now=now,
            exclude_reservation_id=locked.pk,
            any_reserved=any_reserved,
        )
        limits = effective_limits(locked.user)
        if not actor.is_booking_admin:
            check_limits(
                limits=limits,
                slot=(locked.start, new_end),
                asked=Period(locked.end, new_end, _share(gpus)),
                held=_held(limits, user=locked.user, start=locked.end, end=new_end),
                now=now,
            )
        if locked.status == Status.APPROVED and not actor.is_booking_admin and _approval_required(locked.node, limits):
            _request_extension(locked, gpus=gpus, end=new_end, actor=actor, now=now)
            return locked
        before = _snapshot(locked)
        locked.end = new_end
        locked.save(update_fields=["end"])
        _extend_allocations(locked, gpus, new_end)
        _changed(actor, "extend", locked, before)
    return locked


def reservations_end_for_inactive_user(*, user: User, reason: str, actor: Any | None = None) -> list[Reservation]:
    """A deactivated account keeps nothing: its future bookings are cancelled and its running ones
    released now, each audited with ``reason``; the nodes get their new state at once.

    The leases already leave out inactive users (reservations.leases), so the GPUs close even before this
    runs; this makes the calendar, the limits and the records say so too. Idempotent: a booking
    already over, cancelled or rejected is left as it is. Returns the bookings it ended.
    """
    ended = []
    now = timezone.now()
    live = Reservation.objects.filter(user=user, status__in=Reservation.LIVE_STATUSES, end__gt=now)
    # Bookings before their pending extensions, so an extension goes with its booking.
    for pk in live.order_by(F("extends").asc(nulls_first=True), "start", "pk").values_list("pk", flat=True):
        with _booking_transaction():
            try:
                locked = _lock(pk)
            except InvalidState:
                continue  # an extension approved (merged) meanwhile: its booking is in the list too
            now = timezone.now()
            if locked.user.is_active or locked.status not in Reservation.LIVE_STATUSES or locked.end <= now:
                continue
            if locked.start > now or (locked.extends_id is not None and locked.status == Status.PENDING):
                _cancel_locked(locked, actor=actor, now=now, reason=reason)
            else:
                before = _snapshot(locked)
                _end_now(locked, now)
                _changed(actor, "release", locked, before, reason=reason)
            _cancel_pending_extensions(locked, actor=actor, now=now, reason=reason)
            ended.append(locked)
    return ended


# --- one booking's steps, shared with recurring bookings (reservations/series.py) ---------------


def _require_may_book(user: User, actor: Any) -> None:
    """Whether ``actor`` may book for ``user`` at all (before any lock)."""
    if actor.pk != user.pk and not actor.is_booking_admin:
        raise NotAllowed("Only admins can book for someone else.")
    if not user.is_active:
        raise NotAllowed(f"{user.get_username()}'s account is disabled.")
    if not user.unix_username and not user.unix_username_requested:
        # A request waiting for an admin is enough to hold a slot; no GPU opens until it is confirmed.
        raise InvalidBooking(
            f"{user.get_username()} has no unix username yet, so the GPU nodes do not know which account "
            f"gets the GPUs. {who_sets_unix_usernames()}",
            field="unix_username",
        )


def _lock_booker(user: User, gpu_ids: list[int]) -> None:
    """In a booking transaction: lock the user, then the GPUs, and check the account is still active."""
    _lock_active_user(user)
    _lock_cards(gpu_ids)


def _lock_booker_and_load(user: User, gpu_ids: list[int]) -> list[Gpu]:
    """``_lock_booker``, then the units to book as ``_load_gpus`` finds them. Booking whole cards (no MIG
    slices), the lock on the cards reads them too: one query for both."""
    _lock_active_user(user)
    cards = _lock_cards(gpu_ids, load=True)
    if [card.pk for card in cards] == gpu_ids and not any(card.mig_mode for card in cards):
        return _in_booking_order(cards)
    return _load_gpus(gpu_ids)


def _check_booking(
    *,
    user: User,
    actor: Any,
    node: Node,
    gpus: list[Gpu],
    limits: EffectiveLimits,
    start: datetime,
    end: datetime,
    now: datetime,
    also_held: Sequence[Period] = (),
) -> None:
    """Refuse [start, end) on ``gpus`` as a new booking would be refused (slot taken, maintenance, a limit),
    under the locks of ``_lock_booker``. ``also_held`` is what the user is about to hold besides their
    bookings (a series' earlier occurrences not written yet), counted by the limits. Reserved capacity
    (reservations/reserved.py) is checked after the slot, and may lock the node last."""
    any_reserved = _check_slot_free(node=node, gpus=gpus, start=start, end=end)
    check_reserved_capacity(
        user=user, actor=actor, node=node, gpus=gpus, start=start, end=end, now=now, any_reserved=any_reserved
    )
    if not actor.is_booking_admin:
        check_limits(
            limits=limits,
            slot=(start, end),
            asked=Period(start, end, _share(gpus)),
            held=[*_held(limits, user=user, start=start, end=end), *also_held],
            now=now,
        )


def _create_booking(
    *,
    user: User,
    actor: Any,
    node: Node,
    gpus: list[Gpu],
    limits: EffectiveLimits,
    start: datetime,
    end: datetime,
    purpose: str,
    now: datetime,
    alone: bool = False,
    **fields: Any,
) -> Reservation:
    """Write a checked booking (pending where the node or the limits need an admin) and announce it. ``alone``:
    the only booking its ``_booking_transaction`` writes, so a refusal by the exclusion constraint needs no
    savepoint to be explained (see _guarded_by_constraint); a series' occurrences keep theirs, so that an
    occurrence refused for overlapping an earlier one of the same series names it."""
    needs_approval = not actor.is_booking_admin and _approval_required(node, limits)
    reservation = Reservation.objects.create(
        user=user,
        node=node,
        start=start,
        end=end,
        purpose=purpose,
        status=Status.PENDING if needs_approval else Status.APPROVED,
        created_by=actor,
        created_at=now,
        **fields,
    )
    _write_allocations(reservation, gpus, savepoint=not alone)
    _changed(actor, "create", reservation, before=None, gpus=gpus)
    return reservation


# --- the rules ------------------------------------------------------------------------------

_WEEK = timedelta(days=7)


def _require_aware(value: object, field: str) -> None:
    if not isinstance(value, datetime):
        raise InvalidBooking(f"The {field} must be a date and time.", field=field)
    if timezone.is_naive(value):
        raise InvalidBooking(
            f"The {field} has no time zone: give an offset, like 2026-12-03T14:00:00+01:00.", field=field
        )
    require_in_calendar(value, field)


def _snap_slot(start: datetime, end: datetime, now: datetime) -> tuple[datetime, datetime]:
    """Snap to the grid (start down, end up) and refuse past or empty slots.

    The grid cell that holds "now" counts as now: a slot may start in it, and then starts now.
    """
    _require_aware(start, "start")
    _require_aware(end, "end")
    if end <= start:
        raise InvalidBooking(
            f"The end ({format_moment(end)}) must be after the start ({format_moment(start)}).", field="end"
        )
    snapped_start, snapped_end = floor_to_grid(start), ceil_to_grid(end)
    if snapped_start < floor_to_grid(now):
        raise InvalidBooking(f"The start ({format_moment(start)}) is in the past.", field="start")
    if snapped_end <= now:
        raise InvalidBooking(f"The end ({format_moment(end)}) is in the past.", field="end")
    return max(snapped_start, now.replace(microsecond=0)), snapped_end


def _clean_purpose(purpose: object) -> str:
    if purpose is None:
        return ""
    if not isinstance(purpose, str):
        raise InvalidBooking("The purpose must be text.", field="purpose")
    purpose = purpose.strip()
    if len(purpose) > settings.BOOKING_PURPOSE_MAX_LENGTH:
        raise InvalidBooking(
            f"The purpose is {len(purpose)} characters long; keep it under {settings.BOOKING_PURPOSE_MAX_LENGTH}.",
            field="purpose",
        )
    if "\x00" in purpose:
        raise InvalidBooking("The purpose contains a NUL character.", field="purpose")
    return purpose


def _gpu_ids(gpus: Sequence[Gpu | int]) -> list[int]:
    if not gpus:
        raise InvalidBooking("Choose at least one GPU.", field="gpus")
    ids = []
    for gpu in gpus:
        pk = gpu.pk if isinstance(gpu, Gpu) else gpu
        if isinstance(pk, bool) or not isinstance(pk, int):
            raise InvalidBooking(f"{gpu!r} is not a GPU id.", field="gpus")
        ids.append(pk)
    if len(set(ids)) != len(ids):
        raise InvalidBooking("The same GPU is listed twice.", field="gpus")
    return sorted(ids)


def _load_gpus(gpu_ids: list[int]) -> list[Gpu]:
    """The units to book, in order: a card in MIG mode stands for all its slices (booking the card is
    booking every slice of it), and a unit asked for twice (a card and one of its slices) is booked once."""
    found = list(Gpu.objects.select_related("node", "parent").filter(pk__in=gpu_ids))
    missing = sorted(set(gpu_ids) - {gpu.pk for gpu in found})
    if missing:
        raise InvalidBooking(f"No GPU with id {', '.join(map(str, missing))}.", field="gpus", missing=missing)
    units: dict[int, Gpu] = {}
    for gpu in found:
        if gpu.parent_id is None and gpu.mig_mode:
            slices = list(
                gpu.slices.filter(gone_at__isnull=True).select_related("node", "parent").order_by("placement_start")
            )
            if not slices:
                raise InvalidBooking(
                    f"{gpu} is in MIG mode and has no slices the portal knows yet: book it once its agent has "
                    "reported its layout and an admin has confirmed it.",
                    field="gpus",
                )
            units |= {unit.pk: unit for unit in slices}
        else:
            units[gpu.pk] = gpu
    return _in_booking_order(units.values())


def _in_booking_order(units: Iterable[Gpu]) -> list[Gpu]:
    return sorted(units, key=lambda unit: (unit.node.name, unit.index, unit.placement_start, unit.pk))


def _bookable_node(gpus: list[Gpu]) -> Node:
    nodes = {gpu.node for gpu in gpus}
    if len(nodes) > 1:
        names = ", ".join(sorted(node.name for node in nodes))
        raise InvalidBooking(f"All GPUs of one booking must be on one node; these are on {names}.", field="gpus")
    node = gpus[0].node
    if not node.is_bookable:
        raise InvalidBooking(f"Node {node.name} is {node.get_status_display().lower()} and takes no bookings.")
    unbookable = [gpu for gpu in gpus if not _unit_bookable(gpu)]
    if unbookable:
        # A card whose MIG layout changed on the node (nodes/mig.py) is the one reason a person can wait out.
        waiting = sorted({str(card) for card in (gpu.parent or gpu for gpu in unbookable) if card.mig_change_at})
        why = f" The MIG layout of {', '.join(waiting)} changed on its node and waits for an admin." if waiting else ""
        raise InvalidBooking(f"{', '.join(map(str, unbookable))} cannot be booked right now.{why}", field="gpus")
    if node.books_whole:
        every = list(Gpu.objects.filter(node=node, parent=None, bookable=True).order_by("index"))
        if {gpu.pk for gpu in gpus} != {gpu.pk for gpu in every}:
            raise InvalidBooking(
                f"Node {node.name} is managed by Slurm, which reserves whole nodes: book all its {len(every)} GPUs "
                f"(ids {', '.join(str(gpu.pk) for gpu in every)}), which count as {len(every)} in your limits.",
                field="gpus",
            )
    return node


def _unit_bookable(gpu: Gpu) -> bool:
    """A card as it says; a slice only while its card is in MIG mode and bookable too (a drained card
    drains its slices). A slice is bookable once an admin has confirmed the layout it belongs to."""
    if gpu.parent is None:
        return gpu.is_bookable
    return gpu.is_bookable and gpu.parent.mig_mode and gpu.parent.is_bookable


def _check_slot_free(
    *, node: Node, gpus: list[Gpu], start: datetime, end: datetime, reservation: Reservation | None = None
) -> bool:
    """Refuse a slot under maintenance or taken. Returns whether the site has any reserved capacity at all,
    asked in the same query for ``check_reserved_capacity``, which comes next."""
    # Asked first as yes/no, all in one query (no joins to build and read): most slots asked for are free.
    excluded = reservation.pk if reservation else None
    state = booking_sql.slot_state(node=node, gpus=gpus, start=start, end=end, exclude_reservation_id=excluded)
    windows = (
        list(selectors.maintenance_overlapping(node=node, gpus=gpus, start=start, end=end))
        if state.under_maintenance
        else []
    )
    if windows:
        described = "; ".join(
            f"{w.gpu or w.node.name} {format_period(w.start, w.end)}" + (f" ({w.reason})" if w.reason else "")
            for w in windows
        )
        raise MaintenanceConflict(
            f"Maintenance: {described}.",
            windows=[
                {
                    "id": w.pk,
                    "node": w.node.name,
                    "gpu": w.gpu_id,
                    "start": w.start.isoformat(),
                    "end": w.end.isoformat(),
                    "reason": w.reason,
                }
                for w in windows
            ],
        )
    clashes = (
        list(selectors.allocations_overlapping(gpus=gpus, start=start, end=end, exclude_reservation_id=excluded))
        if state.taken
        else []
    )
    if clashes:  # (asked again: one cancelled in between leaves nothing to name, and the constraint guards)
        raise _conflict(clashes)
    return state.any_reserved_capacity


# How a clash's status reads in a refusal ("... by alice (reservation #12, pending)").
_CLASH_NOTE: dict[str, str] = {Status.PENDING: ", pending", Status.OFFERED: ", offered from the waitlist"}


def _conflict(clashes: list[Allocation]) -> SlotConflict:
    described = "; ".join(
        f"{a.gpu} is booked {format_period(a.start, a.end)} by {a.reservation.user.get_username()} "
        f"(reservation #{a.reservation_id}{_CLASH_NOTE.get(a.reservation.status, '')})"
        for a in clashes
    )
    return SlotConflict(
        f"Slot taken: {described}.",
        conflicts=[
            {
                "reservation": a.reservation_id,
                "gpu": a.gpu_id,
                "gpu_name": str(a.gpu),
                "start": a.start.isoformat(),
                "end": a.end.isoformat(),
                "user": a.reservation.user.get_username(),
                "status": a.reservation.status,
            }
            for a in clashes
        ],
    )


def _share(gpus: list[Gpu]) -> Fraction:
    """How many GPUs these units make, a slice counting as its share of its card."""
    return sum((gpu.share_of(gpu.parent) for gpu in gpus), Fraction(0))


def _held(limits: EffectiveLimits, *, user: User, start: datetime, end: datetime) -> list[Period]:
    """The user's bookings that the rolling-week and at-once limits can see from [start, end)."""
    if not limits.counts_usage:
        return []
    return selectors.held_periods(user=user, start=start - _WEEK, end=end + _WEEK)


def _approval_required(node: Node, limits: EffectiveLimits) -> bool:
    return node.requires_approval or limits.requires_approval


def _require_admin(actor: Any, what: str) -> None:
    if not actor.is_booking_admin:
        raise NotAllowed(f"Only admins can {what}.")


def _require_owner_or_admin(actor: Any, reservation: Reservation, verb: str) -> None:
    if actor.pk != reservation.user_id and not actor.is_booking_admin:
        raise NotAllowed(f"Only the owner or an admin can {verb} reservation #{reservation.pk}.")


def _require_status(reservation: Reservation, allowed: Sequence[str], becoming: str) -> None:
    if reservation.status not in allowed:
        raise InvalidState(
            f"Reservation #{reservation.pk} is {reservation.get_status_display().lower()} and cannot be {becoming}.",
            status=reservation.status,
        )


def _require_decided(reservation: Reservation) -> None:
    """An admin approves the slot they looked at: lengthening one that waits for them would have them approve
    more than they saw. Refused for everyone, admins too (they approve first, then extend)."""
    if reservation.status != Status.PENDING:
        return
    if reservation.extends_id is not None:
        raise InvalidState(
            f"Extension request #{reservation.pk} waits for an admin's approval and cannot be made longer: the admin "
            f"approves the time they saw. Withdraw it and extend reservation #{reservation.extends_id} again to the "
            "later end, or wait for the decision and extend then.",
            status=reservation.status,
        )
    raise InvalidState(
        f"Reservation #{reservation.pk} waits for an admin's approval and cannot be extended: the admin approves the "
        "slot they saw. Wait for the decision and extend it then, or cancel it and book the longer slot.",
        status=reservation.status,
    )


def _changed(
    actor: Any,
    verb: str,
    reservation: Reservation,
    before: dict[str, Any] | None,
    reason: str = "",
    mail_verb: str | None = None,
    gpus: Sequence[Gpu] | None = None,
) -> None:
    """Every state change is announced, inside its transaction: the receivers audit it and queue its
    mails with it, and once it commits push the node its new lease state and tell open pages
    (reservations/signals.py lists them). ``gpus``: the booking's units, when the caller has them."""
    after = _snapshot(reservation, gpus)
    touched = [after] + ([before] if before else [])
    reservation_changed.send(
        sender=Reservation,
        reservation=reservation,
        verb=verb,
        mail_verb=mail_verb or verb,
        actor=actor,
        reason=reason,
        before=before,
        after=after,
        touched_start=min(datetime.fromisoformat(s["start"]) for s in touched).astimezone(UTC).isoformat(),
        touched_end=max(datetime.fromisoformat(s["end"]) for s in touched).astimezone(UTC).isoformat(),
    )


def _snapshot(reservation: Reservation, gpus: Sequence[Gpu] | None = None) -> dict[str, Any]:
    """The booking as the audit trail and the signals' receivers see it. ``gpus``: its units, if the caller
    has them loaded (a new booking's), else they are read from its allocations."""
    indexes = (
        [gpu.index for gpu in gpus]
        if gpus is not None
        else reservation.allocations.values_list("gpu__index", flat=True)
    )
    return {
        "user": reservation.user.get_username(),
        "node": reservation.node.name,
        "gpus": sorted(indexes),
        "start": reservation.start.isoformat(),
        "end": reservation.end.isoformat(),
        "status": reservation.status,
        "purpose": reservation.purpose,
    }


# --- writing under the locks ----------------------------------------------------------------


def _cancel_locked(reservation: Reservation, *, actor: Any, now: datetime, reason: str) -> None:
    """Cancel a locked, live reservation: its slot is freed for others."""
    before = _snapshot(reservation)
    reservation.status = Status.CANCELLED
    reservation.cancelled_by = actor if getattr(actor, "pk", None) else None
    reservation.cancelled_at, reservation.cancel_reason = now, reason
    reservation.save(update_fields=["status", "cancelled_by", "cancelled_at", "cancel_reason"])
    reservation.allocations.update(active=False)
    _changed(actor, "cancel", reservation, before, reason=reason)


def _cancel_pending_extensions(reservation: Reservation, *, actor: Any, now: datetime, reason: str) -> None:
    """An undecided extension goes with the booking it extends when that ends early."""
    for pk in reservation.extensions.filter(status=Status.PENDING).values_list("pk", flat=True):
        _cancel_locked(_lock(pk), actor=actor, now=now, reason=reason)


def _end_now(reservation: Reservation, now: datetime) -> None:
    """End a locked, running reservation now; the rest of its slot is freed."""
    # Whole seconds read better everywhere; never let the end reach the start.
    release_at = max(now.replace(microsecond=0), reservation.start + timedelta(seconds=1))
    reservation.end, reservation.released_at = release_at, now
    reservation.save(update_fields=["end", "released_at"])
    reservation.allocations.update(end=release_at)


def _request_extension(
    booking: Reservation, *, gpus: list[Gpu], end: datetime, actor: Any, now: datetime
) -> Reservation:
    """The added time as a pending reservation that extends ``booking`` (locked, approved). Its
    allocations hold the slot like any pending booking's; the admins are asked as for a booking."""
    extension = Reservation.objects.create(
        user=booking.user,
        node=booking.node,
        start=booking.end,
        end=end,
        purpose=booking.purpose,
        status=Status.PENDING,
        created_by=actor,
        created_at=now,
        extends=booking,
    )
    _write_allocations(extension, gpus)
    _changed(actor, "request_extension", extension, before=None, mail_verb="create")
    return extension


def _approve_extension(extension: Reservation, *, booking_id: int, actor: Any, reason: str) -> Reservation:
    """Merge an approved extension into the booking it extends: the booking ends at the
    extension's end, and the extension's own record goes (the audit trail keeps both)."""
    with _booking_transaction():
        booking = _lock(booking_id)
        locked = _lock(extension.pk)
        _require_status(locked, (Status.PENDING,), "approved")
        now = timezone.now()
        if locked.end <= now:
            raise InvalidState(f"Reservation #{locked.pk} ended at {format_moment(locked.end)}: nothing to approve.")
        if booking.status != Status.APPROVED or booking.end != locked.start:
            raise InvalidState(
                f"Reservation #{booking.pk}, which #{locked.pk} would extend, is no longer running up to its start "
                f"({booking.get_status_display().lower()}, ends {format_moment(booking.end)}): reject the extension.",
                status=booking.status,
            )
        before = _snapshot(booking)
        audit_record(
            actor=actor,
            action="reservation.approve",
            target=locked,
            before=_snapshot(locked),
            reason=reason.strip() or f"merged into reservation #{booking.pk}",
        )
        gpus = list(Gpu.objects.filter(allocations__reservation=booking).order_by("pk"))
        # The extension's rows give way first: the booking's own rows then take over its slot,
        # and the exclusion constraint never sees the two overlap.
        locked.allocations.update(active=False)
        booking.end = locked.end
        booking.decided_by, booking.decided_at, booking.decision_reason = actor, now, reason.strip()
        booking.save(update_fields=["end", "decided_by", "decided_at", "decision_reason"])
        _extend_allocations(booking, gpus, locked.end)
        locked.delete()
        _changed(actor, "extend", booking, before, reason=reason.strip(), mail_verb="extension_approved")
    return booking


def _lock(reservation_id: int) -> Reservation:
    """The reservation, row-locked. An extension's row goes when it is approved (merged into its
    booking): whoever acted on it at the same moment gets words, not a 500."""
    try:
        return selectors.reservation_for_update(reservation_id)
    except Reservation.DoesNotExist:
        raise _merged_meanwhile(reservation_id) from None


def _merged_meanwhile(reservation_id: int) -> InvalidState:
    return InvalidState(
        f"Reservation #{reservation_id} no longer exists: an extension is merged into its booking when it "
        "is approved. Look at the booking it extended."
    )


def _lock_booking_rows(*, user_id: int, gpu_ids: list[int]) -> bool:
    """Lock the booking user, then the physical cards of these GPUs in id order (always this order: no
    deadlocks). Cards, not slices: a booking of a card and one of its slice queue up behind one lock.
    Returns whether the user is active, as the locked row says (PostgreSQL reads the row's latest version
    once the lock is granted)."""
    active = _lock_user(user_id)
    _lock_cards(gpu_ids)
    return active


def _lock_user(user_id: int) -> bool:
    """Lock the booking user's row; whether the account is active, as the locked row says."""
    return booking_sql.lock_user(user_id)


def _lock_active_user(user: User) -> None:
    # Read under the user's row lock, which a deactivation's UPDATE needs too: either it committed
    # first and this read sees it, or it comes after and its reaction ends this booking as well.
    if not _lock_user(user.pk):
        raise NotAllowed(f"{user.get_username()}'s account is disabled.")


def _lock_cards(gpu_ids: list[int], *, load: bool = False) -> list[Gpu]:
    """Lock the physical cards of these GPUs in id order; with ``load``, return them with their nodes (the
    node rows are not locked)."""
    return booking_sql.lock_cards(gpu_ids, load=load)


def _write_allocations(reservation: Reservation, gpus: list[Gpu], *, savepoint: bool = True) -> None:
    rows = [
        Allocation(reservation=reservation, gpu=gpu, start=reservation.start, end=reservation.end).place(gpu)
        for gpu in gpus
    ]
    _guarded_by_constraint(lambda: Allocation.objects.bulk_create(rows), gpus, reservation, savepoint=savepoint)


def _extend_allocations(reservation: Reservation, gpus: list[Gpu], new_end: datetime) -> None:
    _guarded_by_constraint(lambda: reservation.allocations.update(end=new_end), gpus, reservation)


class _RefusedByConstraint(Exception):
    """The exclusion constraint refused a write made without a savepoint of its own: the transaction is
    aborted, so ``_booking_transaction`` names the booking that won the race once it has rolled back."""

    def __init__(self, gpus: list[Gpu], start: datetime, end: datetime) -> None:
        super().__init__("the exclusion constraint refused the allocations")
        self.gpus, self.start, self.end = gpus, start, end


def _guarded_by_constraint(
    write: Callable[[], object], gpus: list[Gpu], reservation: Reservation, *, savepoint: bool = True
) -> None:
    """Run ``write``; if the exclusion constraint refuses it, raise the same SlotConflict the
    check would have raised (with the slot that won the race named).

    ``savepoint=False`` spares the two statements of a savepoint where a refusal ends the whole booking
    transaction anyway and nothing else it wrote could be the clash (a single booking, inside
    ``_booking_transaction``, which explains it after the rollback); callers that go on after a refusal (an
    offer tries the next slot) or write several bookings (a series) keep it."""
    try:
        if savepoint:
            with transaction.atomic():
                write()
        else:
            write()
    except IntegrityError as exc:
        if getattr(exc.__cause__, "sqlstate", None) != "23P01":
            raise
        if not savepoint:
            raise _RefusedByConstraint(gpus, reservation.start, reservation.end) from exc
        raise _slot_taken(gpus, reservation.start, reservation.end, exclude_reservation_id=reservation.pk) from exc


def _slot_taken(
    gpus: list[Gpu], start: datetime, end: datetime, *, exclude_reservation_id: int | None = None
) -> SlotConflict:
    clashes = list(
        selectors.allocations_overlapping(
            gpus=gpus, start=start, end=end, exclude_reservation_id=exclude_reservation_id
        )
    )
    return (
        _conflict(clashes)
        if clashes
        else SlotConflict("Slot taken: another booking of these GPUs was saved at the same moment.")
    )


# lock_not_available (lock_timeout), deadlock_detected.
_BUSY_SQLSTATES = {"55P03", "40P01"}


@contextmanager
def _booking_transaction() -> Iterator[None]:
    """A transaction whose lock waits are bounded; a timeout, or being the victim PostgreSQL picks to end a
    deadlock, becomes a retryable BookingBusy (its transaction rolled back: nothing written)."""
    try:
        with transaction.atomic():
            if connection.vendor == "postgresql":
                with connection.cursor() as cursor:
                    cursor.execute(
                        "SELECT set_config('lock_timeout', %s, true)",
                        [f"{settings.BOOKING_LOCK_TIMEOUT_MS}ms"],
                    )
            yield
    except OperationalError as exc:
        if getattr(exc.__cause__, "sqlstate", None) in _BUSY_SQLSTATES or "database is locked" in str(exc):
            raise BookingBusy("The GPUs are busy with other bookings right now; try again in a moment.") from exc
        raise
    except _RefusedByConstraint as refused:  # rolled back by now: the winner's booking is there to be named
        raise _slot_taken(refused.gpus, refused.start, refused.end) from refused.__cause__
