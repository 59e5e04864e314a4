"""A booking's own page, ``/reservations/<id>/``: what and when, how to use it, where it stands, its
history, what other apps know of it (usage, ...) and the actions the viewer may take.

Only the holder and the admins see it, the same people who may act on it
(``selectors.reservations_actionable``); for anyone else the booking does not exist (404), as in the
API. Its forms post to the pages' action endpoint (``pages.reservation_action``), which comes back
here through ``next``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_safe

from accounts.services import who_sets_unix_usernames
from audit.models import AuditEntry
from audit.selectors import audit_trail
from kernel.page_parts import assets
from reservations import selectors
from reservations.calendar_format import gpu_label
from reservations.detail_parts import booking_page_parts
from reservations.forms import EXTEND_HOURS, REASON_MAX_LENGTH
from reservations.models import Reservation
from reservations.pages import reservation_rows
from reservations.timegrid import format_day_time


@require_safe
@login_required
def reservation_detail(request: HttpRequest, pk: int) -> HttpResponse:
    viewer: Any = request.user
    reservation = get_object_or_404(
        selectors.reservations_actionable(user=viewer).select_related("cancelled_by", "created_by"), pk=pk
    )
    now = timezone.now()
    [row] = reservation_rows([reservation], now=now, viewer=viewer)
    parts = booking_page_parts.shown(reservation=reservation, viewer=viewer, now=now)
    extensions = list(reservation.extensions.order_by("pk"))
    context = {
        "nav": "mine" if reservation.user_id == viewer.pk else None,
        "row": row,
        "r": reservation,
        "holder": reservation.user,
        "is_holder": reservation.user_id == viewer.pk,
        "gpus": [{"gpu": gpu, "label": gpu_label(gpu.index, gpu.model, gpu.memory_mib)} for gpu in row.gpus],
        "extensions": extensions,
        "history": history(reservation, extensions=extensions),
        "parts": parts,
        "part_assets": assets(parts),
        "here": request.path,
        # An approved extension is merged into its booking and its own page goes: come back there.
        "after_approve": _page_of(reservation.extends_id) if reservation.extends_id else request.path,
        "extend_hours": EXTEND_HOURS,
        "reason_max_length": REASON_MAX_LENGTH,
        "grid_seconds": settings.BOOKING_GRID_MINUTES * 60,
        "who_sets_unix_usernames": who_sets_unix_usernames(),
    }
    return render(request, "reservations/reservation_detail.html", context)


def _page_of(pk: int) -> str:
    return reverse("reservation-detail", kwargs={"pk": pk})


# --- history --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Event:
    """One line of a booking's history, from the audit trail."""

    at: datetime
    actor: str  # "" for the portal itself (a periodic job)
    what: str
    detail: str
    reason: str
    extension: int | None  # set when the entry is about one of its extension requests


_VERBS = {
    "reservation.create": "Booked",
    "reservation.approve": "Approved",
    "reservation.reject": "Rejected",
    "reservation.cancel": "Cancelled",
    "reservation.release": "Released",
    "reservation.extend": "Extended",
    "reservation.request_extension": "Extension requested",
    "reservation.idle_release": "Released for idleness",
    "reservation.change": "Changed in admin",
    "reservation.delete": "Deleted in admin",
}


def history(reservation: Reservation, *, extensions: list[Reservation]) -> list[Event]:
    """The audit entries about the booking and its extension requests still on record, oldest first.
    (An approved extension is merged: the booking's own "Extended" entry records it.)"""
    entries = audit_trail(model=Reservation, ids=[reservation.pk, *(extension.pk for extension in extensions)])
    return [_event(entry, reservation.pk) for entry in entries]


def _event(entry: AuditEntry, booking_id: int) -> Event:
    before, after = entry.before or {}, entry.after or {}
    what = _VERBS.get(entry.action, entry.action.removeprefix("reservation.").replace("_", " ").capitalize())
    detail = ""
    if entry.action == "reservation.create":
        detail = _period(after)
        if after.get("status") == Reservation.Status.PENDING:
            what = "Booked, waiting for approval"
    elif entry.action in ("reservation.extend", "reservation.release", "reservation.idle_release"):
        if before.get("end") and after.get("end") and before["end"] != after["end"]:
            detail = f"end {_moment(before['end'])} → {_moment(after['end'])}"
    elif entry.action == "reservation.request_extension":
        detail = f"until {_moment(after['end'])}" if after.get("end") else ""
    return Event(
        at=entry.created_at,
        actor=entry.actor_name,
        what=what,
        detail=detail,
        reason=entry.reason,
        extension=None if entry.target_id == str(booking_id) else int(entry.target_id),
    )


def _period(snapshot: dict[str, Any]) -> str:
    if not (snapshot.get("start") and snapshot.get("end")):
        return ""
    gpus = snapshot.get("gpus") or []
    where = f"{snapshot.get('node', '?')}, GPU{'s' if len(gpus) != 1 else ''} {', '.join(map(str, gpus))}"
    return f"{where}, {_moment(snapshot['start'])} – {_moment(snapshot['end'])}"


def _moment(iso: str) -> str:
    try:
        return format_day_time(datetime.fromisoformat(iso))
    except (TypeError, ValueError, OverflowError):
        return iso  # an entry written by hand or by an older version: show it as it is
