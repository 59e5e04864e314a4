"""Server-rendered reservation pages: the booking calendar, my reservations, pending approvals, and
their actions.

The calendar (``/``) is a resource timeline drawn by EventCalendar (vendored under static/vendor/):
GPUs as rows grouped by node, time across. The page carries the rows for the first paint and loads
each visible range from the calendar's endpoint (reservations/calendar_api.py); it changes bookings
through the reservations API like every other client.

The other pages are plain HTML forms that work without JavaScript. Every change goes through reservations.services;
a refusal (BookingError) becomes an error message on the page the user came from, never a 500.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar

from django import forms
from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.middleware.csrf import get_token
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST

from accounts.http import AuthenticatedHttpRequest
from accounts.selectors import unix_username_requests
from accounts.services import who_sets_unix_usernames
from nodes.models import Gpu, cuda_visible_devices
from reservations import selectors, services
from reservations.calendar_data import calendar_resources
from reservations.calendar_format import utc_offset
from reservations.exceptions import BookingError
from reservations.forms import EXTEND_HOURS, ExtendForm, ReasonForm, RequiredReasonForm, first_error
from reservations.models import Reservation
from reservations.permissions import reservation_actions
from reservations.timegrid import format_day_time

Status = Reservation.Status

# How far back "My reservations" shows finished, cancelled and rejected bookings.
PAST_DAYS = 30
PAST_LIMIT = 100
ADMIN_ACTIONS = frozenset({"approve", "reject"})


# --- the calendar ------------------------------------------------------------------------------


@login_required
def calendar_page(request: HttpRequest) -> HttpResponse:
    user: Any = request.user
    zone_name = user.zone.key
    config = {
        "urls": {
            "calendar": reverse("api:calendar"),
            "reservations": reverse("api:reservation-list"),
            "series": reverse("api:series-list"),
            "waitlist": reverse("waitlist"),
            "suggest": reverse("api:availability-suggest"),
            "length_advice": reverse("api:me-length-advice"),
        },
        "csrf_token": get_token(request),
        "user": user.get_username(),
        "is_admin": user.is_booking_admin,
        "grid_minutes": settings.BOOKING_GRID_MINUTES,
        # EventCalendar takes a fixed offset, not a zone name: the calendar shows the offset the
        # user's zone has now, so a week that crosses a DST change is drawn with one offset (times
        # after the change read one hour off). The zone's name is shown on the page.
        "time_zone": {"name": zone_name, "offset": utc_offset(zone_name, timezone.now())},
        "purpose_max_length": settings.BOOKING_PURPOSE_MAX_LENGTH,
        # The rows for the first paint; every data response carries them again.
        "resources": calendar_resources(),
    }
    return render(
        request,
        "reservations/calendar.html",
        {"nav": "calendar", "config": config, "zone_name": zone_name, "zone_offset": config["time_zone"]["offset"]},
    )


# --- my reservations, pending approvals ---------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """A reservation as the pages show it: its GPUs, where it stands, and what can be done."""

    reservation: Reservation
    gpus: list[Gpu]
    phase: str  # "upcoming", "running" or "past" by the clock
    end_input: str  # the current end as a datetime-local value in the user's zone
    actions: frozenset[str]  # what the viewer may do with it now (reservations.permissions)

    @property
    def live(self) -> bool:
        return self.reservation.is_live and self.phase != "past"

    @property
    def is_extension_request(self) -> bool:
        return self.reservation.extends_id is not None and self.reservation.status == Status.PENDING

    @property
    def can_cancel(self) -> bool:
        return "cancel" in self.actions

    @property
    def can_release(self) -> bool:
        return "release" in self.actions

    @property
    def can_extend(self) -> bool:
        return "extend" in self.actions

    @property
    def can_approve(self) -> bool:
        return "approve" in self.actions

    @property
    def can_reject(self) -> bool:
        return "reject" in self.actions

    @property
    def shows_access(self) -> bool:
        """Approved and not over: the user will ssh in and needs the GPUs' ids."""
        return self.live and self.reservation.status == Status.APPROVED

    @property
    def pending_extension(self) -> Reservation | None:
        return selectors.pending_extension(self.reservation)

    @property
    def gpu_indices(self) -> str:
        return ",".join(str(gpu.index) for gpu in self.gpus)

    @property
    def gpu_list(self) -> str:
        return ", ".join(str(gpu.index) for gpu in self.gpus)

    @property
    def cuda_visible_devices(self) -> str:
        return cuda_visible_devices(self.gpus)

    @property
    def gpu_models(self) -> str:
        return ", ".join(sorted({f"{gpu.model} ({gpu.memory_gb} GB)" for gpu in self.gpus}))

    @property
    def badge(self) -> tuple[str, str]:
        """(css class, label) for the status badge."""
        r = self.reservation
        if r.status == Status.CANCELLED:
            return "cancelled", "cancelled"
        if r.status == Status.REJECTED:
            return "rejected", "rejected"
        if r.status == Status.OFFERED:
            return "offered", "offered, not taken" if self.phase == "past" else "offered from the waitlist"
        if r.status == Status.PENDING:
            if self.phase == "past":
                return "pending", "never approved"
            return "pending", "extension: pending approval" if r.extends_id else "tentative: pending approval"
        if self.phase == "running":
            return "running", "running"
        if self.phase == "past":
            return "", "released early" if r.released_at else "finished"
        return "approved", "approved"


def reservation_rows(
    reservations: QuerySet[Reservation] | list[Reservation], *, now: datetime, viewer: Any
) -> list[Row]:
    """Rows for ``viewer``: reservations from ``selectors.reservation_list`` (its prefetches are used)."""
    return [
        Row(
            reservation=r,
            gpus=sorted((a.gpu for a in r.allocations.all()), key=lambda gpu: gpu.index),
            phase=r.phase(now),
            end_input=timezone.localtime(r.end).strftime("%Y-%m-%dT%H:%M"),
            actions=reservation_actions(
                reservation=r, viewer=viewer, now=now, extension_waiting=selectors.pending_extension(r) is not None
            ),
        )
        for r in reservations
    ]


@login_required
def my_reservations(request: AuthenticatedHttpRequest) -> HttpResponse:
    now = timezone.now()
    mine = selectors.reservation_list(user=request.user).filter(user=request.user)
    # A slot offered from the waitlist is held for its person until taken or passed on: it is ahead, not done.
    held = (*Reservation.LIVE_STATUSES, Status.OFFERED)
    current = reservation_rows(mine.filter(status__in=held, end__gt=now), now=now, viewer=request.user)
    past = mine.filter(end__gt=now - timedelta(days=PAST_DAYS)).exclude(status__in=held, end__gt=now)
    running = [row for row in current if row.phase == "running"]
    upcoming = [row for row in current if row.phase == "upcoming"]
    groups = [
        {"id": "running", "title": "Running now", "rows": running, "empty": "Nothing is running right now."},
        {"id": "upcoming", "title": "Upcoming", "rows": upcoming, "empty": "Nothing booked ahead."},
        {
            "id": "past",
            "title": f"Finished, cancelled or rejected (last {PAST_DAYS} days)",
            "rows": reservation_rows(
                past.select_related("cancelled_by").order_by("-start", "-id")[:PAST_LIMIT], now=now, viewer=request.user
            ),
            "empty": f"Nothing finished, cancelled or rejected in the last {PAST_DAYS} days.",
        },
    ]
    context = {
        "nav": "mine",
        "groups": groups,
        "extend_hours": EXTEND_HOURS,
        "grid_seconds": settings.BOOKING_GRID_MINUTES * 60,
        "who_sets_unix_usernames": who_sets_unix_usernames(),
    }
    return render(request, "reservations/mine.html", context)


@login_required
def pending_approvals(request: AuthenticatedHttpRequest) -> HttpResponse:
    if not request.user.is_booking_admin:
        return _forbidden(request)
    now = timezone.now()
    pending = selectors.reservation_list(user=request.user).filter(status=Status.PENDING)
    rows = reservation_rows(pending, now=now, viewer=request.user)
    context = {"nav": "pending", "rows": rows, "unix_requests": unix_username_requests()}
    return render(request, "reservations/pending.html", context)


def _forbidden(request: HttpRequest) -> HttpResponse:
    return render(request, "reservations/pending.html", {"nav": "pending", "forbidden": True}, status=403)


# --- actions -------------------------------------------------------------------------------


_F = TypeVar("_F", bound=forms.Form)


class _BadInput(Exception):
    """A form field is missing or malformed; the message names it."""


def _cancel(request: HttpRequest, reservation: Reservation) -> str:
    form = _valid(ReasonForm(request.POST))
    done = services.reservation_cancel(reservation=reservation, actor=request.user, reason=form.cleaned_data["reason"])
    if done.extends_id is not None:
        return f"Extension request #{done.pk} withdrawn; reservation #{done.extends_id} ends as before."
    return f"Reservation #{done.pk} cancelled; its GPUs are free for others again."


def _release(request: HttpRequest, reservation: Reservation) -> str:
    done = services.reservation_release(reservation=reservation, actor=request.user)
    return f"Reservation #{done.pk} released; GPU access ends now."


def _extend(request: HttpRequest, reservation: Reservation) -> str:
    form = _valid(ExtendForm(request.POST))
    done = services.reservation_extend(reservation=reservation, actor=request.user, end=form.new_end(reservation.end))
    waiting = selectors.pending_extension(done)
    if waiting is not None:
        return (
            f"Extension of reservation #{done.pk} until {_moment(waiting.end)} requested (#{waiting.pk}): it waits "
            f"for an admin's approval and holds that time meanwhile. Until then the booking ends {_moment(done.end)}."
        )
    return f"Reservation #{done.pk} extended: it now ends {_moment(done.end)}."


def _approve(request: HttpRequest, reservation: Reservation) -> str:
    form = _valid(ReasonForm(request.POST))
    done = services.reservation_approve(reservation=reservation, actor=request.user, reason=form.cleaned_data["reason"])
    if done.pk != reservation.pk:
        return (
            f"Extension #{reservation.pk} of {done.user.get_username()} approved: reservation #{done.pk} now ends "
            f"{_moment(done.end)}."
        )
    return f"Reservation #{done.pk} of {done.user.get_username()} approved; the GPUs are theirs from the start."


def _reject(request: HttpRequest, reservation: Reservation) -> str:
    form = _valid(RequiredReasonForm(request.POST))
    done = services.reservation_reject(reservation=reservation, actor=request.user, reason=form.cleaned_data["reason"])
    return f"Reservation #{done.pk} of {done.user.get_username()} rejected; its slot is free again."


ACTIONS: dict[str, Callable[[HttpRequest, Reservation], str]] = {
    "cancel": _cancel,
    "release": _release,
    "extend": _extend,
    "approve": _approve,
    "reject": _reject,
}


@login_required
@require_POST
def reservation_action(request: AuthenticatedHttpRequest, pk: int, action: str) -> HttpResponse:
    if action not in ACTIONS:
        raise Http404(f"No action {action!r}.")
    if action in ADMIN_ACTIONS and not request.user.is_booking_admin:
        return _forbidden(request)
    # Researchers can act on their own reservations only; anyone else's is a 404, as in the API.
    reservation = get_object_or_404(selectors.reservations_actionable(user=request.user), pk=pk)
    try:
        messages.success(request, ACTIONS[action](request, reservation))
    except _BadInput as problem:
        messages.error(request, str(problem))
    except BookingError as error:
        messages.error(request, str(error))
    return back_to_next(request)


def _valid(form: _F) -> _F:
    if not form.is_valid():
        raise _BadInput(first_error(form))
    return form


def back_to_next(request: HttpRequest) -> HttpResponseRedirect:
    """To the local page named in ``next`` (the page the form was on), else to my reservations."""
    target = request.POST.get("next", "")
    if target and url_has_allowed_host_and_scheme(
        target, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return HttpResponseRedirect(target)
    return redirect(reverse("my-reservations"))


def _moment(moment: datetime) -> str:
    """A time in the user's zone, as the pages show it."""
    return f"{format_day_time(moment)} ({timezone.get_current_timezone_name()})"
