"""A recurring booking's page, ``/series/<id>/``: its occurrences and their state, and the series' actions
(book what came within reach, cancel from an occurrence on, cancel the whole series). Only the owner and
admins see it (404 for anyone else, as in the API). Booking a series happens in the calendar's dialog,
through the API (static/js/calendar.js)."""

from __future__ import annotations

from datetime import date, datetime, time, timedelta

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.views.decorators.http import require_POST, require_safe

from accounts.http import AuthenticatedHttpRequest
from reservations.exceptions import BookingError, InvalidBooking
from reservations.models import Series
from reservations.series import series_book_within_reach, series_cancel, series_edit, series_occurrences
from reservations.series_api import visible_series


@require_safe
@login_required
def series_detail(request: HttpRequest, pk: int) -> HttpResponse:
    series = get_object_or_404(visible_series(request.user), pk=pk)
    rows = series_occurrences(series)
    context = {
        "nav": "mine",
        "series": series,
        "rows": rows,
        "gpus": sorted(series.gpus.all(), key=lambda gpu: (gpu.index, gpu.pk)),
        # The wall time each occurrence ends at (it may end on the next day).
        "end_time": (datetime.combine(series.first_day, series.start_time) + series.duration).time(),
        "waiting": sum(1 for row in rows if row["state"] == "not_booked"),
        # The occurrences an edit may start from: those still to come and not cancelled.
        "editable": [row for row in rows if row["state"] in ("pending", "approved", "not_booked")],
        "minutes": int(series.duration / timedelta(minutes=1)),
    }
    return render(request, "reservations/series_detail.html", context)


@login_required
@require_POST
def series_action(request: AuthenticatedHttpRequest, pk: int, action: str) -> HttpResponse:
    series: Series = get_object_or_404(visible_series(request.user), pk=pk)
    try:
        if action == "book":
            report = series_book_within_reach(series=series, actor=request.user)
            messages.success(request, report.summary)
        elif action == "cancel":
            scope = request.POST.get("scope", "all")
            from_day = _day(request.POST.get("from", "")) if scope == "following" else None
            cancelled = series_cancel(series=series, actor=request.user, scope=scope, from_day=from_day)
            count = len(cancelled)
            messages.success(request, f"Series #{series.pk}: {count} booking{'' if count == 1 else 's'} cancelled.")
        elif action == "edit":
            report = series_edit(
                series=series,
                actor=request.user,
                from_day=_day(request.POST.get("from", "")),
                start_time=_time(request.POST.get("start_time", "")),
                duration=_duration(request.POST.get("minutes", "")),
                mode=request.POST.get("mode", Series.Mode.ALL_OR_NOTHING),
            )
            messages.success(request, f"Series #{series.pk} changed: {report.summary}")
        else:
            raise Http404(f"No action {action!r}.")
    except BookingError as error:
        messages.error(request, str(error))
    return HttpResponseRedirect(reverse("series-detail", kwargs={"pk": series.pk}))


def _time(raw: str) -> time | None:
    if not raw:
        return None
    try:
        return time.fromisoformat(raw)
    except ValueError:
        raise InvalidBooking(f"{raw!r} is not a time of day like 10:00.", field="start_time") from None


def _duration(raw: str) -> timedelta | None:
    if not raw:
        return None
    if not raw.isdigit() or not 0 < int(raw) <= 7 * 24 * 60:
        raise InvalidBooking("The duration is a whole number of minutes, at most a week.", field="minutes")
    return timedelta(minutes=int(raw))


def _day(raw: str) -> date | None:
    try:
        return date.fromisoformat(raw)
    except ValueError:
        return None
