"""MIG layouts that need a person: bookings on slices that vanished, and cards whose layout changed.

Bookings on MIG slices that vanished from their node: each is flagged for the admins (an alert per
booking and slice) and its holder is told by mail, once.

A slice vanishes when its node stops reporting it (the layout changed on the node: nodes/mig.py marks
it gone and takes it out of booking). Its bookings stay, since the portal cannot move them to another
slice by itself; they can no longer open anything on the node. The alert resolves when an admin
resolves it (having rebooked, or cancelled, with the holder).

A card whose agent reports another MIG mode or other card numbers (nodes/mig.py) is out of booking, its
arithmetic unchanged, until an admin confirms the layout: one alert per card while it waits, its details the
newest report, resolved by the confirmation.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db.models import Q
from django.utils import timezone

from alerts.models import Alert
from alerts.records import Subject, alert_open, alerts_resolve
from nodes.mig import CardLayout
from nodes.models import Gpu, Node
from notifications.hooks import send_after_commit
from notifications.models import Kind as MailKind
from notifications.services import notification_enqueue
from reservations.models import Allocation, Reservation


def alerts_slices_gone(*, node: Node, gpu_ids: Sequence[int], now: datetime) -> list[int]:
    """Flag the live bookings (running or to come) on these vanished slices and tell their holders, in the
    caller's transaction. Returns the bookings flagged."""
    live = Q(reservation__status__in=Reservation.LIVE_STATUSES, end__gt=now, active=True)
    allocations = (
        Allocation.objects.filter(live, gpu_id__in=list(gpu_ids))
        .select_related("gpu", "reservation__user")
        .order_by("pk")
    )
    flagged: list[int] = []
    for allocation in allocations.order_by("pk"):
        reservation, holder, piece = allocation.reservation, allocation.reservation.user, allocation.gpu
        opened = alert_open(
            subject=Subject(Alert.Kind.SLICE_GONE, node.pk, piece.pk, holder.unix_username or holder.get_username()),
            now=now,
            details={"slice": f"GPU {piece.index} {piece.profile}", "uuid": piece.uuid, "reservation": reservation.pk},
            reservation_id=reservation.pk,
        )
        if opened is None:
            continue  # flagged already: told already
        notification_enqueue(
            kind=MailKind.SLICE_GONE,
            reservation=reservation,
            users=[holder],
            moment=now,
            context={"slice": f"GPU {piece.index} · {piece.profile}"},
        )
        send_after_commit(reservation.pk)
        flagged.append(reservation.pk)
    return flagged


def alerts_mig_layout_changed(*, card: Gpu, confirmed: CardLayout, reported: CardLayout, now: datetime) -> None:
    """Open the card's alert, in the report's transaction; while it is open, a newer report only updates what
    it shows."""
    subject = Subject(Alert.Kind.MIG_LAYOUT_CHANGED, card.node_id, card.pk)
    details = {"confirmed": confirmed.as_dict(), "reported": reported.as_dict()}
    if alert_open(subject=subject, now=now, details=details) is None:
        subject.open_alerts().update(details=details)


def alerts_mig_layout_confirmed(*, card: Gpu, actor: Any) -> None:
    alerts_resolve(
        Subject(Alert.Kind.MIG_LAYOUT_CHANGED, card.node_id, card.pk).open_alerts(),
        now=timezone.now(),
        resolution="the layout was confirmed",
        actor=actor,
    )
