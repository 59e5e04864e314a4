"""Which mail goes to whom, and when; each one at most once.

Two ways in:
- ``booking_changed(reservation_id, verb)``: run by a Celery task once a booking change commits
  (reservations.services._changed): confirmed or waiting (and "approval needed" to the admins),
  approved, rejected.
- ``send_due(now)``: run by beat every NOTIFY_SCAN_SECONDS: slots that started, slots ending within
  each holder's reminder time, slots that ended (with their usage). It looks at what is due *now*,
  so after downtime it catches up with what is still meaningful: a "starting" mail while the slot
  runs, a reminder while the slot has not ended, an "ended" mail up to NOTIFY_ENDED_CATCHUP_HOURS.

Every mail is a ``Notification`` row claimed by a compare-and-swap on ``sent_at`` (see its
docstring): two beats, a retry or a redelivered task never send one twice. A mail that fails to go
out gives its claim back, and the task's retry (or the next scan) tries again.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db.models import Exists, OuterRef, Q
from django.urls import reverse
from django.utils import timezone

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


# --- sending one --------------------------------------------------------------------------------


def preferences_of(user: Any) -> MailPreferences:
    preferences, _ = MailPreferences.objects.get_or_create(user=user)
    return preferences


def send_once(*, kind: str, reservation: Reservation, user: Any, moment: datetime, context: dict[str, Any]) -> bool:
    """Send this mail unless it went (or was skipped) before; True if this call sent it."""
    if not user.email or not user.is_active:
        return False
    note, _ = Notification.objects.get_or_create(kind=kind, reservation=reservation, user=user, moment=moment)
    unsent = Notification.objects.filter(pk=note.pk, sent_at__isnull=True)
    now = timezone.now()
    if not preferences_of(user).wants(kind):
        unsent.update(sent_at=now, skipped=True)
        return False
    if not unsent.update(sent_at=now):
        return False  # someone else has it
    try:
        # No zone of their own: the site's, as on the pages (accounts/middleware.py).
        with timezone.override(user.zone if user.timezone else None):
            send_templated(to=[user.email], template=kind, context=_booking_context(reservation, user) | context)
    except Exception:
        Notification.objects.filter(pk=note.pk).update(sent_at=None)  # give the claim back for a retry
        raise
    return True


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


# --- when a booking changes ---------------------------------------------------------------------


def booking_changed(reservation_id: int, verb: str) -> int:
    """The mails a committed change calls for; returns how many went."""
    reservation = Reservation.objects.select_related("user", "node", "decided_by").filter(pk=reservation_id).first()
    if reservation is None:
        return 0
    owner = reservation.user
    sent = 0
    moment = reservation.start
    if verb == "create" and reservation.status == Status.APPROVED:
        sent += send_once(kind=Kind.BOOKING_CONFIRMED, reservation=reservation, user=owner, moment=moment, context={})
    elif verb == "create" and reservation.status == Status.PENDING:
        sent += send_once(kind=Kind.BOOKING_PENDING, reservation=reservation, user=owner, moment=moment, context={})
        portal = settings.PORTAL_URL.rstrip("/")
        for admin in _booking_admins(exclude=owner):
            sent += send_once(
                kind=Kind.APPROVAL_NEEDED,
                reservation=reservation,
                user=admin,
                moment=moment,
                context={"owner": owner, "pending_url": portal + reverse("pending-approvals")},
            )
    elif verb == "approve" and reservation.status == Status.APPROVED:
        sent += send_once(kind=Kind.APPROVED, reservation=reservation, user=owner, moment=moment, context={})
    elif verb == "reject" and reservation.status == Status.REJECTED:
        sent += send_once(kind=Kind.REJECTED, reservation=reservation, user=owner, moment=moment, context={})
    return sent


def _booking_admins(*, exclude: Any) -> Iterable[Any]:
    admins = get_user_model().objects.filter(Q(is_staff=True) | Q(is_superuser=True), is_active=True)
    return admins.exclude(email="").exclude(pk=exclude.pk).order_by("pk")


# --- what is due now ----------------------------------------------------------------------------


def _sent(kind: str, moment_field: str) -> Exists:
    """This kind of mail went (or was skipped) for the booking's ``moment_field``; a claim given
    back after a failure does not count, so the scan tries that one again."""
    return Exists(
        Notification.objects.filter(
            kind=kind,
            reservation=OuterRef("pk"),
            user=OuterRef("user"),
            moment=OuterRef(moment_field),
            sent_at__isnull=False,
        )
    )


def send_due(now: datetime | None = None) -> dict[str, int]:
    """Every mail due at ``now`` that has not gone yet; returns how many of each kind went."""
    now = now or timezone.now()
    approved = Reservation.objects.filter(status=Status.APPROVED).select_related("user", "node")
    sent = {Kind.SLOT_STARTING: 0, Kind.SLOT_ENDING: 0, Kind.SLOT_ENDED: 0}

    starting = approved.filter(start__lte=now, end__gt=now).exclude(_sent(Kind.SLOT_STARTING, "start"))
    for reservation in starting:
        sent[Kind.SLOT_STARTING] += _send_safely(Kind.SLOT_STARTING, reservation, reservation.start, {})

    ending = approved.filter(start__lte=now, end__gt=now, end__lte=now + MAX_REMINDER).exclude(
        _sent(Kind.SLOT_ENDING, "end")
    )
    for reservation in ending:
        notice = timedelta(minutes=reservation.user.remind_before_end_minutes)
        if notice and reservation.end - notice <= now:
            context = {"minutes_left": round((reservation.end - now).total_seconds() / 60)}
            context["can_extend"] = next_slot_free(reservation)
            sent[Kind.SLOT_ENDING] += _send_safely(Kind.SLOT_ENDING, reservation, reservation.end, context)

    catchup = timedelta(hours=settings.NOTIFY_ENDED_CATCHUP_HOURS)
    ended = approved.filter(end__lte=now, end__gt=now - catchup).exclude(_sent(Kind.SLOT_ENDED, "end"))
    for reservation in ended:
        gpu_ids = list(Allocation.objects.filter(reservation=reservation).values_list("gpu_id", flat=True))
        context = {"usage": usage_during(gpu_ids, reservation.start, reservation.end)}
        sent[Kind.SLOT_ENDED] += _send_safely(Kind.SLOT_ENDED, reservation, reservation.end, context)
    return {str(kind): count for kind, count in sent.items()}


def _send_safely(kind: str, reservation: Reservation, moment: datetime, context: dict[str, Any]) -> bool:
    """One mail of a scan; a failure is logged and left for the next scan (its claim given back)."""
    try:
        return send_once(kind=kind, reservation=reservation, user=reservation.user, moment=moment, context=context)
    except Exception:
        logger.exception("%s mail for reservation #%s not sent; the next scan tries again", kind, reservation.pk)
        return False


def next_slot_free(reservation: Reservation) -> bool:
    """Whether the booking's GPUs are free for at least one grid step after its end."""
    gpus = list(Gpu.objects.filter(allocations__reservation=reservation))
    after = selectors.allocations_overlapping(
        gpus=gpus, start=reservation.end, end=reservation.end + grid(), exclude_reservation_id=reservation.pk
    )
    return not after.exists()
