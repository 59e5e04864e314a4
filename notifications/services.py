"""Which mail goes to whom, and when: written to an outbox with what causes it, sent at least once.

Every mail is a ``Notification`` row, unique per (kind, booking, person, moment). Rows are written
by what causes the mail, inside its transaction, so a mail exists exactly when its cause committed:
- ``booking_changed(reservation, verb)``: a booking change, from inside the booking service's
  transaction (notifications.hooks.mail_after_commit): confirmed or waiting (and "approval needed"
  to the admins), approved (a booking, or an extension merged into it), rejected.
- ``notification_enqueue(...)``: the same for other causes (alerts/: an idle booking's holder).
- ``notifications_due(now)``: what time makes due, run by beat's ``send_due``: slots that started,
  slots ending within each holder's reminder time, slots that ended (with their usage). It looks at
  what is due *now*, so after downtime it catches up with what is still meaningful: a "starting"
  mail while the slot runs, a reminder while the slot has not ended, an "ended" mail up to
  NOTIFY_ENDED_CATCHUP_HOURS.

Rows are sent (``notification_deliver``) by the worker nudged once the cause commits
(notifications.tasks.send_outbox) and by beat's drain (``send_due`` ends with ``outbox_drain``),
which sends every row still waiting: its nudge was lost (the broker was down), its send failed (SMTP
down: retried with a backoff) or its sender died after claiming it (the claim expires after
NOTIFY_CLAIM_SECONDS). A sender claims a row by a compare-and-swap, so two beats, a nudge and a
drain, or a redelivered task never send one at once; a sender that dies between sending and
recording it may have it sent twice, which is the price of never losing one.

A mail is rendered when it is sent, from the booking as it is then. One that no longer applies (a
booking decided before its "approval needed" mail could go, a reminder for a slot that has ended)
is skipped with the reason, as is a kind the person turned off.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db.models import Exists, F, OuterRef, Q
from django.urls import reverse
from django.utils import timezone

from accounts.models import User
from nodes.models import Gpu, cuda_visible_devices
from nodes.usage import usage_during
from notifications.mail import send_templated
from notifications.models import Kind, MailPreferences, Notification
from reservations import selectors
from reservations.models import Allocation, Reservation
from reservations.timegrid import format_moment, format_period, grid

logger = logging.getLogger(__name__)

Status = Reservation.Status
# Reminders are looked for this far ahead at most (the profile allows up to this much notice).
MAX_REMINDER = timedelta(hours=24)
# A send that failed is tried again after a minute, then after twice as long each time, at most
# an hour apart; a mail that could not go out in a day is given up (the row says why).
RETRY_FIRST = timedelta(minutes=1)
RETRY_LONGEST = timedelta(hours=1)
GIVE_UP_AFTER = timedelta(hours=24)
# One drain sends at most this many (oldest first); the next beat takes the rest.
DRAIN_BATCH = 500
SCAN_KINDS = (Kind.SLOT_STARTING, Kind.SLOT_ENDING, Kind.SLOT_ENDED)


def preferences_of(user: User) -> MailPreferences:
    preferences, _ = MailPreferences.objects.get_or_create(user=user)
    return preferences


# --- writing mail to the outbox -------------------------------------------------------------------


def notification_enqueue(
    *,
    kind: str,
    reservation: Reservation,
    users: Iterable[User],
    moment: datetime,
    context: dict[str, Any] | None = None,
) -> int:
    """Write one outbox row per person who has an address, in the caller's transaction; a row that
    exists already (same kind, booking, person and moment) stays as it is. ``context`` is what the
    mail says that is decided now (JSON). Returns how many rows were asked for."""
    rows = [
        Notification(kind=kind, reservation=reservation, user=user, moment=moment, context=context or {})
        for user in users
        if user.email and user.is_active
    ]
    if rows:
        Notification.objects.bulk_create(rows, ignore_conflicts=True)
    return len(rows)


def booking_changed(reservation: Reservation, verb: str) -> int:
    """The mails a booking change calls for, written in the change's transaction: who gets what is
    decided from the booking as the change left it. Returns how many rows were asked for."""
    owner, status = reservation.user, reservation.status
    # What the templates may ask of the change: ``change`` (the verb), ``extension_approved``.
    context = {"change": verb, "extension_approved": verb == "extension_approved"}

    def write(kind: str, users: Iterable[User], moment: datetime = reservation.start) -> int:
        return notification_enqueue(kind=kind, reservation=reservation, users=users, moment=moment, context=context)

    # A pending extension (``extends`` set) is created like a booking: the same kinds, worded by the
    # templates from ``reservation.extends``.
    if verb == "create" and status == Status.APPROVED:
        return write(Kind.BOOKING_CONFIRMED, [owner])
    if verb == "create" and status == Status.PENDING:
        return write(Kind.BOOKING_PENDING, [owner]) + write(Kind.APPROVAL_NEEDED, _booking_admins(exclude=owner))
    if verb == "approve" and status == Status.APPROVED:
        return write(Kind.APPROVED, [owner])
    if verb == "extension_approved" and status == Status.APPROVED:
        # The extension was merged into the booking: its new end tells this approval from the booking's own.
        return write(Kind.APPROVED, [owner], moment=reservation.end)
    if verb == "reject" and status == Status.REJECTED:
        return write(Kind.REJECTED, [owner])
    return 0


def _booking_admins(*, exclude: User) -> Iterable[User]:
    admins = get_user_model().objects.filter(Q(is_staff=True) | Q(is_superuser=True), is_active=True)
    return admins.exclude(email="").exclude(pk=exclude.pk).order_by("pk")


def _written(kind: str, moment_field: str) -> Exists:
    """This kind of mail is in the outbox (sent, skipped or waiting) for the booking's ``moment_field``."""
    return Exists(
        Notification.objects.filter(
            kind=kind, reservation=OuterRef("pk"), user=OuterRef("user"), moment=OuterRef(moment_field)
        )
    )


def notifications_due(now: datetime) -> int:
    """Write the mails time made due at ``now`` that are not in the outbox yet; returns how many."""
    approved = Reservation.objects.filter(status=Status.APPROVED).select_related("user")
    written = 0
    starting = approved.filter(start__lte=now, end__gt=now).exclude(_written(Kind.SLOT_STARTING, "start"))
    for reservation in starting:
        written += notification_enqueue(
            kind=Kind.SLOT_STARTING, reservation=reservation, users=[reservation.user], moment=reservation.start
        )
    ending = approved.filter(start__lte=now, end__gt=now, end__lte=now + MAX_REMINDER).exclude(
        _written(Kind.SLOT_ENDING, "end")
    )
    for reservation in ending:
        notice = timedelta(minutes=reservation.user.remind_before_end_minutes)
        if notice and reservation.end - notice <= now:
            written += notification_enqueue(
                kind=Kind.SLOT_ENDING, reservation=reservation, users=[reservation.user], moment=reservation.end
            )
    catchup = timedelta(hours=settings.NOTIFY_ENDED_CATCHUP_HOURS)
    ended = approved.filter(end__lte=now, end__gt=now - catchup).exclude(_written(Kind.SLOT_ENDED, "end"))
    for reservation in ended:
        written += notification_enqueue(
            kind=Kind.SLOT_ENDED, reservation=reservation, users=[reservation.user], moment=reservation.end
        )
    return written


# --- sending from the outbox ----------------------------------------------------------------------


def _free(now: datetime) -> Q:
    """Rows waiting and nobody's: never claimed, or their claim (a send, a retry's wait) is over."""
    return Q(sent_at__isnull=True) & (Q(claimed_until__isnull=True) | Q(claimed_until__lte=now))


def send_due(now: datetime | None = None) -> dict[str, int]:
    """Beat, every NOTIFY_SCAN_SECONDS: write what time made due, then send everything waiting in
    the outbox. Returns how many of each kind went (the slot kinds always named)."""
    now = now or timezone.now()
    notifications_due(now)
    return {str(kind): 0 for kind in SCAN_KINDS} | outbox_drain(now=now)


def outbox_drain(
    *, now: datetime | None = None, reservation_id: int | None = None, limit: int = DRAIN_BATCH
) -> dict[str, int]:
    """Send the free rows of the outbox (of one booking, if given), oldest first, at most ``limit``;
    returns how many of each kind went."""
    now = now or timezone.now()
    waiting = Notification.objects.filter(_free(now))
    if reservation_id is not None:
        waiting = waiting.filter(reservation_id=reservation_id)
    sent: dict[str, int] = {}
    for pk, kind in waiting.order_by("created_at", "pk").values_list("pk", "kind")[:limit]:
        if notification_deliver(pk):
            sent[kind] = sent.get(kind, 0) + 1
    return sent


def notification_claim(pk: int, now: datetime) -> bool:
    """Take the row for NOTIFY_CLAIM_SECONDS if it is free (a compare-and-swap); True if this call did."""
    claim = timedelta(seconds=settings.NOTIFY_CLAIM_SECONDS)
    return bool(
        Notification.objects.filter(_free(now), pk=pk).update(claimed_until=now + claim, attempts=F("attempts") + 1)
    )


def notification_deliver(pk: int) -> bool:
    """Claim one row, and send it unless it no longer applies; True if this call sent it. A failed
    send never raises: it is recorded and tried again later (RETRY_FIRST, doubling)."""
    now = timezone.now()
    if not notification_claim(pk, now):
        return False  # sent, skipped, or someone else's for now
    note = (
        Notification.objects.select_related("user", "reservation__user", "reservation__node", "reservation__decided_by")
        .filter(pk=pk)
        .first()
    )
    if note is None:  # its booking went (a merged extension) since it was listed
        return False
    why_not = _why_not(note, now)
    if why_not:
        Notification.objects.filter(pk=pk, sent_at__isnull=True).update(
            sent_at=now, claimed_until=None, skipped=True, skip_reason=why_not[:200]
        )
        return False
    user = note.user
    try:
        # No zone of their own: the site's, as on the pages (accounts/middleware.py).
        with timezone.override(user.zone if user.timezone else None):
            send_templated(to=[user.email], template=note.kind, context=_context(note, now))
    except Exception as exc:  # SMTP away, say: this row waits, the others go on
        retry = min(RETRY_FIRST * 2 ** max(note.attempts - 1, 0), RETRY_LONGEST)
        Notification.objects.filter(pk=pk, sent_at__isnull=True).update(
            claimed_until=now + retry, last_error=f"{type(exc).__name__}: {exc}"[:500]
        )
        logger.warning("%s mail #%s to %s not sent (%s); tried again in %s", note.kind, pk, user, exc, retry)
        return False
    Notification.objects.filter(pk=pk, sent_at__isnull=True).update(
        sent_at=timezone.now(), claimed_until=None, last_error=""
    )
    return True


def _why_not(note: Notification, now: datetime) -> str:
    """Why this mail is not to be sent now (given up), or ""."""
    user = note.user
    if not user.is_active:
        return "the account is disabled"
    if not user.email:
        return "no mail address"
    if now - note.created_at > GIVE_UP_AFTER:
        return f"not sent within {GIVE_UP_AFTER.total_seconds() / 3600:.0f} hours: {note.last_error}"
    if not preferences_of(user).wants(note.kind):
        return "turned off in the mail preferences"
    return _obsolete(note, note.reservation, now)


def _obsolete(note: Notification, reservation: Reservation, now: datetime) -> str:
    """Why the booking no longer calls for this mail (it changed while the mail waited), or ""."""
    kind, status = note.kind, reservation.status
    if kind in (Kind.BOOKING_PENDING, Kind.APPROVAL_NEEDED) and status != Status.PENDING:
        return f"the booking was {reservation.get_status_display().lower()} before this mail could go"
    if kind in (Kind.BOOKING_CONFIRMED, Kind.APPROVED, Kind.SLOT_STARTING, Kind.SLOT_ENDING, Kind.SLOT_ENDED) and (
        status != Status.APPROVED
    ):
        return f"the booking is {reservation.get_status_display().lower()} now"
    if kind in (Kind.BOOKING_CONFIRMED, Kind.BOOKING_PENDING, Kind.APPROVAL_NEEDED, Kind.APPROVED) and (
        reservation.end <= now
    ):
        return "the slot ended before this mail could go"
    if kind == Kind.SLOT_STARTING and not reservation.start <= now < reservation.end:
        return "the slot is not running any more"
    if kind in (Kind.SLOT_ENDING, Kind.SLOT_ENDED) and reservation.end != note.moment:
        return "the slot's end moved (a new mail is due for the new end)"
    if kind == Kind.SLOT_ENDING and reservation.end <= now:
        return "the slot ended before the reminder could go"
    if kind == Kind.SLOT_ENDED and reservation.end <= now - timedelta(hours=settings.NOTIFY_ENDED_CATCHUP_HOURS):
        return "too late to matter (NOTIFY_ENDED_CATCHUP_HOURS)"
    if kind == Kind.SLICE_GONE and (not reservation.is_live or reservation.end <= now):
        return "the booking is over or cancelled: its vanished slice no longer matters"
    if kind == Kind.WAITLIST_OFFER and status != Status.OFFERED:
        return "the offer was claimed or passed on before this mail could go"
    claim_by = note.context.get("claim_by") if kind == Kind.WAITLIST_OFFER else None
    if claim_by and datetime.fromisoformat(claim_by) <= now:
        return "the time to claim the offer ran out before this mail could go"
    return ""


def _context(note: Notification, now: datetime) -> dict[str, Any]:
    reservation, kind = note.reservation, note.kind
    context: dict[str, Any] = _booking_context(reservation, note.user) | note.context
    if kind == Kind.APPROVAL_NEEDED:
        portal = settings.PORTAL_URL.rstrip("/")
        context |= {"owner": reservation.user, "pending_url": portal + reverse("pending-approvals")}
    elif kind == Kind.SLOT_ENDING:
        context |= {
            "minutes_left": round((reservation.end - now).total_seconds() / 60),
            "can_extend": next_slot_free(reservation),
        }
    elif kind == Kind.SLOT_ENDED:
        gpu_ids = list(Allocation.objects.filter(reservation=reservation).values_list("gpu_id", flat=True))
        context["usage"] = usage_during(gpu_ids, reservation.start, reservation.end)
    elif kind == Kind.WAITLIST_OFFER:
        claim_by = note.context.get("claim_by")
        context |= {
            "claim_by": format_moment(datetime.fromisoformat(claim_by)) if claim_by else "",
            "waitlist_url": settings.PORTAL_URL.rstrip("/") + "/waitlist/",
        }
    elif kind in (Kind.IDLE, Kind.IDLE_RELEASED):
        release_at = note.context.get("release_at")
        context |= {
            "end": format_moment(reservation.end),
            "release_at": format_moment(datetime.fromisoformat(release_at)) if release_at else "",
        }
    return context


def _booking_context(reservation: Reservation, user: Any) -> dict[str, Any]:
    gpus = list(Gpu.objects.filter(allocations__reservation=reservation).order_by("index"))
    portal = settings.PORTAL_URL.rstrip("/")
    return {
        "user": user,
        "reservation": reservation,
        "node": reservation.node,
        "gpu_list": ", ".join(str(gpu.index) for gpu in gpus),
        "gpu_models": ", ".join(sorted({gpu.model for gpu in gpus})),
        "cuda_visible_devices": cuda_visible_devices(gpus),
        "period": format_period(reservation.start, reservation.end),
        "start_text": format_moment(reservation.start),
        "end_text": format_moment(reservation.end),
        "mine_url": portal + reverse("my-reservations"),
        "preferences_url": portal + reverse("mail-preferences"),
    }


def next_slot_free(reservation: Reservation) -> bool:
    """Whether the booking's GPUs are free for at least one grid step after its end."""
    gpus = list(Gpu.objects.filter(allocations__reservation=reservation))
    after = selectors.allocations_overlapping(
        gpus=gpus, start=reservation.end, end=reservation.end + grid(), exclude_reservation_id=reservation.pk
    )
    return not after.exists()
