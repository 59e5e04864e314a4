"""The waitlist: joining, leaving, and handing freed capacity to the best waiting entry.

How a freed slot travels (docs/booking-rules.md, "Waitlist"):
1. A change frees capacity (a booking cancelled, rejected or released early; an offer declined or lapsed).
   ``offers_for_freed`` runs **inside that change's transaction** (a receiver of reservation_changed): it
   ranks the open entries that could use it (fair-share factor, then arrival), and for the first that fits
   their limits writes an **offer** (reservations/offers.py: an OFFERED reservation, which the database's
   no-overlap rule protects like any booking), then the next, while capacity is left. Nobody else can take
   the slot meanwhile, and a change that is rolled back offers nothing.
2. **Right after commit**, ``offer_settle`` runs in its own transaction: an entry that chose auto-booking
   gets the booking (``offer_accept``: the person's lock, then the cards', the limits checked again); one
   that did not is mailed and has ``WAITLIST_CLAIM_MINUTES`` to claim it. An offer its person can no longer
   take is withdrawn, which frees it again: back to step 1 for the next entry.
3. Beat's ``waitlist_sweep`` lapses offers nobody claimed (withdrawn: step 1 again), expires entries whose
   window has passed, and settles any offer whose after-commit step was lost (a worker killed between the
   two).

An entry passed over because of its limits keeps waiting, with the reason shown to its owner.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from accounts.models import User
from nodes.models import Gpu, Node
from notifications.hooks import send_after_commit
from notifications.models import Kind as MailKind
from notifications.services import notification_enqueue
from reservations import selectors as booking
from reservations.exceptions import (
    BookingBusy,
    BookingError,
    InvalidBooking,
    InvalidState,
    LimitExceeded,
    NotAllowed,
)
from reservations.limits import effective_limits
from reservations.models import Reservation
from reservations.offers import offer_accept, offer_create, offer_fits_limits, offer_withdraw
from reservations.reserved import restrictions_for, room_left, within_room
from reservations.timegrid import ceil_to_grid, floor_to_grid, format_moment, grid
from waitlist import selectors
from waitlist.models import Entry

log = logging.getLogger(__name__)
Status = Entry.Status
# How many start times are tried for one entry in one freed slot: enough for a day in 15-minute steps.
_MOST_STARTS = 96


@dataclass(frozen=True)
class Want:
    """What someone asks to wait for, as the API and the page take it."""

    earliest_start: datetime
    latest_end: datetime
    duration: timedelta
    gpus: Sequence[Gpu] = ()
    node: Node | None = None
    gpu_model: str = ""
    profile: str = ""
    count: int = 1
    purpose: str = ""
    auto_book: bool = True


# --- joining and leaving -----------------------------------------------------------------------------------


def entry_join(*, user: User, want: Want, now: datetime | None = None) -> Entry:
    """Put ``user`` on the waitlist for ``want``; if the capacity is free already, it is offered at once."""
    now = now or timezone.now()
    _validate(user, want, now)
    with transaction.atomic():
        # The person's row, as a booking locks it: two joins at once cannot both pass the entry limit.
        list(User.objects.select_for_update().filter(pk=user.pk).values_list("pk", flat=True))
        waiting = Entry.objects.filter(user=user, status__in=Entry.OPEN_STATUSES).count()
        if waiting >= settings.WAITLIST_MAX_ENTRIES:
            raise NotAllowed(
                f"You are waiting for {waiting} things already (at most {settings.WAITLIST_MAX_ENTRIES}): "
                "leave one before joining again."
            )
        node = want.node or (want.gpus[0].node if want.gpus else None)
        entry = Entry.objects.create(
            user=user,
            node=node,
            gpu_model=want.gpu_model if not want.gpus else "",
            profile=want.profile if not want.gpus else "",
            count=len(want.gpus) if want.gpus else want.count,
            earliest_start=want.earliest_start,
            latest_end=want.latest_end,
            duration=want.duration,
            purpose=want.purpose,
            auto_book=want.auto_book,
            created_at=now,
        )
        if want.gpus:
            entry.gpus.set(want.gpus)
        # Free already? Then it is offered now, as freed capacity would be (on any node of the model, for a
        # want of a model).
        nodes = [node] if node is not None else Node.objects.filter(gpus__model=want.gpu_model).distinct()
        for where in nodes:
            _offer_to(
                _candidates(Entry.objects.filter(pk=entry.pk)),
                freed_ids=set(),
                start=None,
                end=None,
                now=now,
                node=where,
            )
    entry.refresh_from_db()
    return entry


def entry_leave(*, entry: Entry, actor: Any) -> Entry:
    """Leave the waitlist; a slot on offer passes on to the next entry."""
    _require_owner_or_admin(actor, entry)
    with transaction.atomic():
        locked = Entry.objects.select_for_update().get(pk=entry.pk)
        if not locked.is_open:
            raise InvalidState(f"Waitlist entry #{locked.pk} is {locked.get_status_display().lower()} already.")
        offer = locked.reservation if locked.status == Status.OFFERED else None
        _close(locked, Status.LEFT)
        if offer is not None:
            _withdraw(offer, actor=actor, reason=f"{locked.user.get_username()} left the waitlist")
    return locked


def _validate(user: User, want: Want, now: datetime) -> None:
    if not user.is_active:
        raise NotAllowed(f"{user.get_username()}'s account is disabled.")
    if not user.unix_username and not user.unix_username_requested:
        raise InvalidBooking(
            f"{user.get_username()} has no unix username yet, so no GPU could open for a slot; ask for one first.",
            field="unix_username",
        )
    if want.duration <= timedelta(0):
        raise InvalidBooking("The duration must be positive.", field="duration")
    if want.duration % grid():
        minutes = settings.BOOKING_GRID_MINUTES
        raise InvalidBooking(f"The duration must be a multiple of {minutes} minutes.", field="duration")
    if want.latest_end <= now:
        raise InvalidBooking(f"The window ends in the past ({format_moment(want.latest_end)}).", field="latest_end")
    if want.latest_end - max(want.earliest_start, now) < want.duration:
        raise InvalidBooking(
            f"The window {format_moment(want.earliest_start)} to {format_moment(want.latest_end)} is shorter than "
            "the duration asked for.",
            field="latest_end",
        )
    limits = effective_limits(user)
    if limits.max_days_ahead is not None and want.latest_end - now > timedelta(days=limits.max_days_ahead):
        raise InvalidBooking(
            f"The window ends more than {limits.max_days_ahead} days ahead, further than you may book.",
            field="latest_end",
        )
    if limits.max_slot_hours is not None and want.duration > timedelta(hours=float(limits.max_slot_hours)):
        raise InvalidBooking(
            f"The duration is longer than your longest slot ({limits.max_slot_hours:g} hours).", field="duration"
        )
    if want.gpus:
        if len({gpu.node_id for gpu in want.gpus}) > 1:
            raise InvalidBooking("All GPUs of one want must be on one node.", field="gpus")
        if len(want.gpus) > settings.WAITLIST_MAX_COUNT:
            raise InvalidBooking(f"Ask for 1 to {settings.WAITLIST_MAX_COUNT} GPUs.", field="gpus")
    elif want.node is None and not want.gpu_model:
        raise InvalidBooking("Say which GPUs: these GPUs, any N on a node, or any N of a model.", field="gpus")
    elif not 1 <= want.count <= settings.WAITLIST_MAX_COUNT:
        raise InvalidBooking(f"Ask for 1 to {settings.WAITLIST_MAX_COUNT} GPUs.", field="count")


# --- freed capacity goes to the best waiting entry ------------------------------------------------------


def offers_for_freed(*, node: Node, gpu_ids: Iterable[int], start: datetime, end: datetime, now: datetime) -> None:
    """Offer the freed [start, end) on ``gpu_ids`` (of ``node``) to the waiting entries that can use it, best
    first, in the caller's transaction. Called by the receiver of every change that frees capacity."""
    start = max(start, now)
    if end <= start:
        return
    freed = set(gpu_ids)
    models = set(Gpu.objects.filter(pk__in=freed).values_list("model", flat=True))
    entries = Entry.objects.filter(status=Status.WAITING, earliest_start__lt=end, latest_end__gt=start).filter(
        Q(node=node) | Q(node__isnull=True, gpu_model__in=models)
    )
    _offer_to(_candidates(entries), freed_ids=freed, start=start, end=end, now=now, node=node)


def _candidates(entries: QuerySet[Entry]) -> list[Entry]:
    # A disabled account waits for nothing (its entries are closed by a receiver, or by beat's sweep).
    entries = entries.filter(user__is_active=True).select_related("user", "node").prefetch_related("gpus__parent")
    return selectors.ranked(entries, now=timezone.now())


class _Capacity:
    """What is taken on one node, read once for a round of offers and kept up to date as offers are written:
    a cancellation with hundreds of waiters costs one read of the node's bookings, not one per waiter."""

    def __init__(self, node: Node, *, start: datetime, end: datetime) -> None:
        self.node, self.start, self.end = node, start, end
        self.places = booking.taken_places(node_ids=[node.pk], start=start, end=end)
        self._units: dict[tuple[str, str], list[Gpu]] = {}

    def covers(self, start: datetime, end: datetime) -> bool:
        return self.start <= start and end <= self.end

    def units(self, *, profile: str, model: str) -> list[Gpu]:
        """The node's bookable units of a profile (or cards) and model, read once each."""
        key = (profile, model)
        if key not in self._units:
            units = booking.bookable_units(profile=profile).filter(node=self.node).select_related("node", "parent")
            if model:
                units = units.filter(Q(model=model) | Q(parent__model=model))
            self._units[key] = list(units.order_by("index", "placement_start"))
        return self._units[key]

    def took(self, units: list[Gpu], start: datetime, end: datetime) -> None:
        self.places += [booking.Place(unit.card_id, *unit.placement, start, end) for unit in units]

    def any_free(self, units: list[Gpu], start: datetime, end: datetime) -> bool:
        """Whether any of ``units`` has a grid step free in [start, end)."""
        moment = floor_to_grid(start)
        while moment < end:
            if any(booking.is_free(unit, self.places, moment, moment + grid()) for unit in units):
                return True
            moment += grid()
        return False


def _offer_to(
    entries: list[Entry],
    *,
    freed_ids: set[int],
    start: datetime | None,
    end: datetime | None,
    now: datetime,
    node: Node | None = None,
) -> None:
    """Give each entry in turn the earliest slot that fits it and touches [start, end) (any time in its
    window when None), until nothing fits any more or the freed units are all taken again."""
    capacity: dict[int, _Capacity] = {}
    freed_units = list(Gpu.objects.filter(pk__in=freed_ids).select_related("parent")) if freed_ids else []
    for entry in entries:
        at = entry.node or node
        if at is None:
            continue  # "any of a model" needs a node's freed capacity to look at
        # The entry's lock: two changes freeing capacity at once must not both offer it a slot. Taken in rank
        # order, so they queue up rather than deadlock; one offered meanwhile no longer matches.
        if not Entry.objects.select_for_update().filter(pk=entry.pk, status=Status.WAITING).values("pk").first():
            continue
        offer = _first_fit(entry, freed_ids=freed_ids, start=start, end=end, now=now, node=at, capacity=capacity)
        if offer is None:
            continue
        entry.status, entry.reservation, entry.offered_at = Status.OFFERED, offer, now
        entry.claim_by = None if entry.auto_book else now + timedelta(minutes=settings.WAITLIST_CLAIM_MINUTES)
        entry.save(update_fields=["status", "reservation", "offered_at", "claim_by"])
        transaction.on_commit(partial(_settle_quietly, entry.pk))
        known = capacity.get(at.pk)
        if freed_units and start and end and known and not known.any_free(freed_units, start, end):
            return  # everything freed is offered again: the others keep waiting for the next change


def _first_fit(
    entry: Entry,
    *,
    freed_ids: set[int],
    start: datetime | None,
    end: datetime | None,
    now: datetime,
    node: Node,
    capacity: dict[int, _Capacity],
) -> Reservation | None:
    """The offer written for ``entry``, or None when nothing fits it (the reason kept when it is its limits)."""
    first = max(entry.earliest_start, floor_to_grid(now))
    last = entry.latest_end - entry.duration
    if start is not None and end is not None:  # the slot must use some of the freed time
        first = max(first, start - entry.duration + grid())
        last = min(last, end - grid())
    first = ceil_to_grid(first)
    if last < first:
        return None
    known = capacity.get(node.pk)
    if known is None or not known.covers(first, last + entry.duration):
        # Read once for what this round can reach: the freed time with the longest want around it.
        low, high = first, last + entry.duration
        if start is not None and end is not None:
            reach = timedelta(days=1) + entry.duration
            low, high = min(low, start - reach), max(high, end + reach)
        known = capacity[node.pk] = _Capacity(node, start=low, end=high)
    specific = list(entry.gpus.all())
    units = specific or known.units(profile=entry.profile, model=entry.gpu_model)
    if len(units) < entry.count:
        return None
    # Capacity reserved for groups the person is not in is not theirs to be offered (reservations/reserved.py).
    kept = restrictions_for(user=entry.user, nodes=[node], start=first, end=last + entry.duration, now=now)
    taken = [*known.places, *(booking.Place(*place) for place in kept.places)]
    moment, tried = first, 0
    while moment <= last and tried < _MOST_STARTS:
        slot_start, slot_end = max(moment, now.replace(microsecond=0)), moment + entry.duration
        moment += grid()
        free = [unit for unit in units if booking.is_free(unit, taken, slot_start, slot_end)]
        if len(free) < entry.count or (specific and len(free) < len(units)):
            continue
        # The freed units first, so that a slot freed on GPU 2 is not offered as GPU 0 and 1 (whatever is free
        # on the node serves as well: a GPU back from a drain frees capacity without any booking changing).
        free.sort(key=lambda unit: unit.pk not in freed_ids)
        if kept.counted:
            free = within_room(free, room_left(node=node, counted=kept.counted, start=slot_start, end=slot_end))
            if len(free) < entry.count:
                continue
        chosen = free[: entry.count]
        tried += 1
        if not entry.user.is_booking_admin:
            try:
                offer_fits_limits(user=entry.user, units=chosen, start=slot_start, end=slot_end, now=now)
            except LimitExceeded as refused:
                _skip(entry, refused, now)
                return None
        try:
            offer = offer_create(
                user=entry.user, gpus=chosen, start=slot_start, end=slot_end, purpose=entry.purpose, now=now
            )
        except BookingError:
            continue  # maintenance, reserved for others, taken meanwhile: try the next start
        known.took(chosen, slot_start, slot_end)
        return offer
    return None


def _skip(entry: Entry, refused: BookingError, now: datetime) -> None:
    entry.skip_reason, entry.skipped_at = f"Passed over for a free slot: {refused}", now
    entry.save(update_fields=["skip_reason", "skipped_at"])


# --- settling, claiming, declining -------------------------------------------------------------------------


def _settle_quietly(entry_id: int) -> None:
    try:
        offer_settle(entry_id)
    except Exception:  # the sweep settles it later
        log.exception("waitlist entry %s: settling its offer failed; beat's sweep will retry", entry_id)


def offer_settle(entry_id: int) -> Entry | None:
    """After the offer's transaction committed: book it for an auto-booking entry, or tell its owner there
    is a slot to claim."""
    entry = Entry.objects.select_related("user", "reservation").filter(pk=entry_id, status=Status.OFFERED).first()
    if entry is None or entry.reservation is None:
        return None
    if entry.auto_book:
        return _take(entry, actor=None)
    with transaction.atomic():
        notification_enqueue(
            kind=MailKind.WAITLIST_OFFER,
            reservation=entry.reservation,
            users=[entry.user],
            moment=entry.offered_at or timezone.now(),
            context={"claim_by": entry.claim_by.isoformat() if entry.claim_by else "", "entry": entry.pk},
        )
        send_after_commit(entry.reservation.pk)
    return entry


def offer_claim(*, entry: Entry, actor: Any) -> Entry:
    """The owner takes the slot on offer: it becomes their booking (approved, or pending where needed)."""
    _require_owner_or_admin(actor, entry)
    return _take(entry, actor=actor, claiming=True)


def offer_decline(*, entry: Entry, actor: Any) -> Entry:
    """The owner does not want the slot on offer: it passes on, and the entry ends."""
    _require_owner_or_admin(actor, entry)
    with transaction.atomic():
        locked = Entry.objects.select_for_update().get(pk=entry.pk)
        if locked.status != Status.OFFERED or locked.reservation is None:
            raise InvalidState(f"Waitlist entry #{locked.pk} has no slot on offer.")
        offer = locked.reservation
        _close(locked, Status.DECLINED)
        _withdraw(offer, actor=actor, reason=f"{locked.user.get_username()} declined the offer")
    return locked


def _take(entry: Entry, *, actor: Any, claiming: bool = False) -> Entry:
    """Turn the entry's offer into its booking, under the entry's lock (so a lapse, a decline or a second
    settle cannot cross it). An auto-booking that cannot be booked (over the limits, the node drained or
    under maintenance since, the slot over) passes the offer on (``_pass_on``); a claim that cannot is refused
    with the reason (the offer stays until it lapses or is declined)."""
    with transaction.atomic():
        locked = Entry.objects.select_for_update(of=("self",)).select_related("user", "reservation").get(pk=entry.pk)
        if locked.status != Status.OFFERED or locked.reservation is None:
            if claiming:
                raise InvalidState(
                    f"Waitlist entry #{locked.pk} has no slot on offer ({locked.get_status_display().lower()})."
                )
            return locked
        if claiming and locked.claim_by is not None and locked.claim_by <= timezone.now():
            raise InvalidState(f"The offer ran out at {format_moment(locked.claim_by)}; it passes to the next person.")
        offer = locked.reservation
        try:
            booking = offer_accept(reservation=offer, actor=actor)
        except BookingBusy:
            raise  # locks held elsewhere for a moment: the offer stays, and settling is tried again (the sweep)
        except BookingError as refused:
            if claiming:
                raise
            _pass_on(locked, refused)
            return locked
        locked.status, locked.reservation, locked.ended_at = Status.BOOKED, booking, timezone.now()
        locked.claim_by, locked.skip_reason = None, ""
        locked.save(update_fields=["status", "reservation", "ended_at", "claim_by", "skip_reason"])
        return locked


def _pass_on(entry: Entry, refused: BookingError | None = None) -> None:
    """The entry's offer will not become its booking (``refused`` says why; None: it was cancelled or ended
    elsewhere): the offer passes on, and the entry waits again with the reason, or ends when its window has
    passed or its account is disabled. The caller holds the entry's lock."""
    offer, now = entry.reservation, timezone.now()
    if not entry.user.is_active:
        _close(entry, Status.LEFT)
    elif _window_passed(entry, now):
        _close(entry, Status.EXPIRED)
    else:
        entry.status, entry.reservation, entry.claim_by = Status.WAITING, None, None
        entry.save(update_fields=["status", "reservation", "claim_by"])
        if refused is not None:
            _skip(entry, refused, now)
    if offer is not None and offer.status == Reservation.Status.OFFERED:
        reason = f"{entry.user.get_username()} could not take it: {refused}" if refused else "passed on"
        _withdraw(offer, actor=None, reason=reason)


def entries_close_for_inactive_user(user_id: int) -> list[int]:
    """A disabled account waits for nothing: its open entries end (left) and any slot on offer passes on.
    Run when an account is deactivated (waitlist/receivers.py) and by beat's sweep. Returns the entries."""
    closed = []
    open_entries = Entry.objects.filter(user_id=user_id, user__is_active=False, status__in=Entry.OPEN_STATUSES)
    for pk in open_entries.values_list("pk", flat=True):
        with transaction.atomic():
            entry = (
                Entry.objects.select_for_update(of=("self",))
                .select_related("user", "reservation")
                .filter(pk=pk, status__in=Entry.OPEN_STATUSES, user__is_active=False)
                .first()
            )
            if entry is None:
                continue
            _pass_on(entry)
            closed.append(pk)
    return closed


def _withdraw(offer: Reservation, *, actor: Any, reason: str) -> None:
    """Pass an offer on; the caller holds its entry's lock, so nobody takes it meanwhile."""
    with contextlib.suppress(InvalidState):  # already cancelled (its node's bookings ended, say)
        offer_withdraw(reservation=offer, actor=actor, reason=reason)


def _window_passed(entry: Entry, now: datetime) -> bool:
    """Its window can no longer hold its duration from now (on the grid): the entry expires."""
    return entry.latest_end - entry.duration < floor_to_grid(now)


def _close(entry: Entry, status: str) -> None:
    entry.status, entry.ended_at, entry.claim_by = status, timezone.now(), None
    entry.save(update_fields=["status", "ended_at", "claim_by"])


def _require_owner_or_admin(actor: Any, entry: Entry) -> None:
    if actor is None or (actor.pk != entry.user_id and not actor.is_booking_admin):
        raise NotAllowed(f"Waitlist entry #{entry.pk} is someone else's.")


# --- beat ---------------------------------------------------------------------------------------------------


@dataclass
class Sweep:
    lapsed: list[int]
    expired: list[int]
    settled: list[int]
    passed_on: list[int]


def waitlist_sweep(now: datetime | None = None) -> Sweep:
    """Lapse unclaimed offers (each passes on once), expire entries whose window has passed, settle
    auto-booking offers whose after-commit step never ran, and pass on what can no longer be taken (an offer
    cancelled or ended elsewhere, an account disabled). Idempotent; one entry that fails is logged and the
    others still go."""
    now = now or timezone.now()
    sweep = Sweep(lapsed=[], expired=[], settled=[], passed_on=[])
    # Offered, but the offer was cancelled elsewhere or its slot is over: nobody can take it any more.
    gone = Q(reservation__isnull=True) | ~Q(reservation__status=Reservation.Status.OFFERED)
    gone |= Q(reservation__end__lte=now)
    for pk in Entry.objects.filter(gone, status=Status.OFFERED).values_list("pk", flat=True):
        with transaction.atomic():
            locked = Entry.objects.select_for_update(of=("self",)).select_related("user", "reservation")
            entry = locked.filter(gone, pk=pk, status=Status.OFFERED).first()
            if entry is not None:
                _pass_on(entry)
                sweep.passed_on.append(pk)
    for user_id in set(
        Entry.objects.filter(status__in=Entry.OPEN_STATUSES, user__is_active=False).values_list("user_id", flat=True)
    ):
        sweep.passed_on += entries_close_for_inactive_user(user_id)
    for pk in Entry.objects.filter(status=Status.OFFERED, claim_by__lte=now).values_list("pk", flat=True):
        with transaction.atomic():
            entry = Entry.objects.select_for_update().filter(pk=pk, status=Status.OFFERED, claim_by__lte=now).first()
            if entry is None:
                continue  # claimed or declined meanwhile
            offer = entry.reservation
            _close(entry, Status.LAPSED)
            if offer is not None:
                _withdraw(offer, actor=None, reason=f"{entry.user.get_username()} did not claim it in time")
            sweep.lapsed.append(pk)
    stale = now - timedelta(minutes=1)
    for pk in Entry.objects.filter(status=Status.OFFERED, auto_book=True, offered_at__lte=stale).values_list(
        "pk", flat=True
    ):
        try:
            settled = offer_settle(pk)
        except Exception:  # the next sweep tries again; the others go on
            log.exception("waitlist entry %s: settling its offer failed", pk)
            continue
        if settled is not None:
            sweep.settled.append(pk)
    for entry in Entry.objects.filter(status=Status.WAITING).only("pk", "latest_end", "duration"):
        if _window_passed(entry, now) and Entry.objects.filter(pk=entry.pk, status=Status.WAITING).update(
            status=Status.EXPIRED, ended_at=now
        ):
            sweep.expired.append(entry.pk)
    return sweep
