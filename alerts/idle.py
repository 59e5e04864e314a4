"""Booked GPUs left idle: their holders are told, and with IDLE_AUTO_RELEASE_MINUTES the booking goes.

Beat runs ``alerts_check_idle`` every minute: a GPU held by a running booking whose every reported
minute of the last ALERT_IDLE_MINUTES stayed under ALERT_IDLE_UTILIZATION_PCT opens an "idle" alert
(shown to admins, never mailed to staff). Its holder gets one mail per booking; with
IDLE_AUTO_RELEASE_MINUTES set, a booking whose every GPU is still idle that long after is released.
Both mails go through the mail outbox (notifications/), written in the transaction that decides them.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from types import SimpleNamespace
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Count, Sum

from alerts.models import Alert
from alerts.records import Subject, alert_open, alerts_resolve
from audit.services import audit_record
from nodes.models import GpuMinute
from nodes.usage import busy_minutes
from notifications.hooks import send_after_commit
from notifications.models import Kind as MailKind
from notifications.services import notification_enqueue
from reservations.exceptions import BookingError
from reservations.models import Allocation, Reservation
from reservations.services import reservation_release

logger = logging.getLogger(__name__)

Kind = Alert.Kind
# An idle window must have been reported for this share of its minutes (a silent node is not idle).
IDLE_COVERAGE = 0.9
# Who releases idle bookings: the portal itself (the audit trail shows no person).
PORTAL = SimpleNamespace(pk=None, is_booking_admin=True)


@dataclass
class IdleRun:
    opened: list[int] = field(default_factory=list)
    resolved: list[int] = field(default_factory=list)
    holders_told: list[int] = field(default_factory=list)
    released: list[int] = field(default_factory=list)


def alerts_check_idle(*, now: datetime) -> IdleRun:
    """Beat: GPUs held by a running booking whose every reported minute of the last
    ALERT_IDLE_MINUTES stayed under ALERT_IDLE_UTILIZATION_PCT (mean of the minute's samples).
    Idempotent: what it opens is unique while open, and each mail is claimed by a compare-and-swap."""
    run = IdleRun()
    minutes = settings.ALERT_IDLE_MINUTES
    pct = settings.ALERT_IDLE_UTILIZATION_PCT
    window_end = now.replace(second=0, microsecond=0)
    window_start = window_end - timedelta(minutes=minutes)
    running = {
        a.gpu_id: a
        for a in Allocation.objects.filter(
            active=True, start__lte=now, end__gt=now, reservation__status=Reservation.Status.APPROVED
        ).select_related("reservation__user", "gpu__node")
    }
    stats = (
        GpuMinute.objects.filter(
            gpu_id__in=list(running), minute__gte=window_start, minute__lt=window_end, utilization_samples__gt=0
        )
        .values("gpu_id")
        .annotate(
            minutes=Count("pk"),
            busy=Count("pk", filter=busy_minutes(pct)),
            total=Sum("utilization_sum"),
            samples=Sum("utilization_samples"),
        )
    )
    needed = math.ceil(minutes * IDLE_COVERAGE)
    idle, busy = {}, set()
    for stat in stats:
        if stat["busy"]:
            busy.add(stat["gpu_id"])
        elif stat["minutes"] >= needed and running[stat["gpu_id"]].start <= window_start:
            idle[stat["gpu_id"]] = stat

    open_idle = {a.gpu_id: a for a in Alert.objects.filter(kind=Kind.IDLE, resolved_at__isnull=True)}
    for gpu_id, alert in open_idle.items():
        allocation = running.get(gpu_id) if gpu_id is not None else None
        if allocation is None or allocation.reservation_id != alert.reservation_id:
            reason = "the slot ended"
        elif gpu_id in busy:
            reason = "the GPU is in use again"
        else:
            continue
        run.resolved += alerts_resolve(Alert.objects.filter(pk=alert.pk), now=now, resolution=reason)

    for gpu_id, stat in idle.items():
        allocation = running[gpu_id]
        holder = allocation.reservation.user
        opened = alert_open(
            subject=Subject(Kind.IDLE, allocation.gpu.node_id, gpu_id, holder.unix_username or holder.get_username()),
            now=now,
            reservation_id=allocation.reservation_id,
            details={
                "reservation": allocation.reservation_id,
                "minutes": stat["minutes"],
                "mean_utilization_pct": round(stat["total"] / stat["samples"], 1),
                "limit_pct": pct,
            },
        )
        if opened is not None:
            run.opened.append(opened.pk)

    run.holders_told = _tell_idle_holders(now)
    if settings.IDLE_AUTO_RELEASE_MINUTES > 0:
        run.released = _release_idle(now)
    return run


def _tell_idle_holders(now: datetime) -> list[int]:
    """One mail per booking naming its idle GPUs; each GPU of a booking is told about once. The mail
    is written to the outbox in the transaction that marks its alerts told, so it goes at least once."""
    pending = list(
        Alert.objects.filter(
            kind=Kind.IDLE, resolved_at__isnull=True, holder_notified_at__isnull=True, reservation__isnull=False
        ).select_related("node", "gpu", "reservation__user")
    )
    told_before = set(
        Alert.objects.filter(
            kind=Kind.IDLE, reservation_id__in=[a.reservation_id for a in pending], holder_notified_at__isnull=False
        ).values_list("reservation_id", "gpu_id")
    )
    by_reservation: dict[int, list[Alert]] = defaultdict(list)
    for alert in pending:
        if alert.reservation_id is not None:  # always: the query asks for a booking
            by_reservation[alert.reservation_id].append(alert)
    told = []
    for reservation_id, alerts in by_reservation.items():
        with transaction.atomic():
            fresh = []
            for alert in alerts:
                claim = Alert.objects.filter(pk=alert.pk, holder_notified_at__isnull=True)
                if (reservation_id, alert.gpu_id) in told_before:
                    claim.update(holder_notified_at=now)  # this GPU of this booking was told once already
                elif claim.update(holder_notified_at=now):
                    fresh.append(alert)
            if not fresh:
                continue
            reservation = fresh[0].reservation
            assert reservation is not None
            notification_enqueue(
                kind=MailKind.IDLE,
                reservation=reservation,
                users=[reservation.user],
                moment=now,
                context=_idle_mail_context(fresh, now),
            )
            send_after_commit(reservation_id)
        told.append(reservation_id)
    return told


def _idle_mail_context(alerts: list[Alert], now: datetime) -> dict[str, Any]:
    """What an idle mail says (JSON, kept with the mail in the outbox; notifications renders it)."""
    auto = settings.IDLE_AUTO_RELEASE_MINUTES
    gpus = sorted(a.gpu.index for a in alerts if a.gpu is not None)
    return {
        "gpus": gpus,
        "gpu_list": ", ".join(f"GPU {index}" for index in gpus),
        "minutes": settings.ALERT_IDLE_MINUTES,
        "limit_pct": settings.ALERT_IDLE_UTILIZATION_PCT,
        "release_minutes": auto,
        "release_at": (now + timedelta(minutes=auto)).isoformat() if auto > 0 else "",
    }


def _release_idle(now: datetime) -> list[int]:
    """Bookings whose every running GPU stayed idle IDLE_AUTO_RELEASE_MINUTES after the holder was
    told are released (reservations.services.reservation_release, audited with the reason)."""
    cutoff = now - timedelta(minutes=settings.IDLE_AUTO_RELEASE_MINUTES)
    due = Alert.objects.filter(
        kind=Kind.IDLE, resolved_at__isnull=True, released_at__isnull=True, holder_notified_at__lte=cutoff
    )
    released = []
    for reservation_id in set(due.values_list("reservation_id", flat=True)):
        reservation = Reservation.objects.select_related("user", "node").filter(pk=reservation_id).first()
        if reservation is None:
            continue
        gpus = set(reservation.allocations.filter(active=True).values_list("gpu_id", flat=True))
        alerts = list(due.filter(reservation_id=reservation_id).select_related("gpu"))
        if {a.gpu_id for a in alerts} != gpus:
            continue  # some of its GPUs are in use: the booking stays
        minutes, pct = settings.ALERT_IDLE_MINUTES, settings.ALERT_IDLE_UTILIZATION_PCT
        reason = (
            f"idle: under {pct} % utilisation for {minutes} minutes, and still "
            f"{settings.IDLE_AUTO_RELEASE_MINUTES} minutes after the holder was told (IDLE_AUTO_RELEASE_MINUTES)"
        )
        with transaction.atomic():
            ids = [a.pk for a in alerts]
            if Alert.objects.filter(pk__in=ids, released_at__isnull=True).update(released_at=now) != len(ids):
                transaction.set_rollback(True)  # another run is releasing it
                continue
            try:
                ended = reservation_release(reservation=reservation, actor=PORTAL)
            except BookingError as exc:  # ended or released meanwhile: nothing to take back
                logger.info("idle booking %s not released: %s", reservation_id, exc)
                alerts_resolve(Alert.objects.filter(pk__in=ids), now=now, resolution="the slot ended")
                continue
            audit_record(actor=None, action="reservation.idle_release", target=reservation, reason=reason)
            alerts_resolve(Alert.objects.filter(pk__in=ids), now=now, resolution="booking released automatically")
            # The holder's mail commits with the release (the outbox), or not at all.
            notification_enqueue(
                kind=MailKind.IDLE_RELEASED,
                reservation=ended,
                users=[ended.user],
                moment=ended.end,
                context=_idle_mail_context(alerts, now) | {"reason": reason},
            )
            send_after_commit(reservation_id)
        released.append(reservation_id)
    return released
