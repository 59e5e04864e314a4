"""The waitlist pages: your entries (claim, decline, leave, join) and, for admins, the queue per node."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.views.decorators.http import require_POST

from accounts.http import AuthenticatedHttpRequest
from reservations.exceptions import BookingError
from reservations.forms import first_error
from waitlist import selectors, services
from waitlist.forms import JoinForm
from waitlist.models import Entry

ACTIONS = {
    "claim": (services.offer_claim, "The slot is yours: it is on your reservations."),
    "decline": (services.offer_decline, "Declined: the slot passes to the next person waiting."),
    "leave": (services.entry_leave, "You left the waitlist."),
}


@login_required
def waitlist_page(request: AuthenticatedHttpRequest) -> HttpResponse:
    now = timezone.now()
    form = JoinForm(request.POST or None, initial=_prefill(request))
    if request.method == "POST":
        if not form.is_valid():
            messages.error(request, first_error(form))
        else:
            try:
                entry = services.entry_join(user=request.user, want=_want(form.cleaned_data))
            except BookingError as error:
                messages.error(request, str(error))
            else:
                messages.success(request, _joined(entry))
                return redirect("waitlist")
    mine = list(Entry.objects.filter(user=request.user).select_related("node", "reservation").prefetch_related("gpus"))
    selectors.with_positions(mine, now=now)
    context = {
        "nav": "waitlist",
        "form": form,
        "offers": [entry for entry in mine if entry.status == Entry.Status.OFFERED],
        "waiting": [entry for entry in mine if entry.status == Entry.Status.WAITING],
        "closed": sorted(
            (entry for entry in mine if not entry.is_open), key=lambda e: e.ended_at or e.created_at, reverse=True
        )[:20],
        "claim_minutes": settings.WAITLIST_CLAIM_MINUTES,
    }
    return render(request, "waitlist/waitlist.html", context, status=400 if form.errors else 200)


@require_POST
@login_required
def waitlist_action(request: AuthenticatedHttpRequest, pk: int, action: str) -> HttpResponse:
    if action not in ACTIONS:
        raise Http404(f"No action {action!r}.")
    # Someone else's entry is a 404, as in the API; admins may act on anyone's.
    visible = Entry.objects.all() if request.user.is_booking_admin else Entry.objects.filter(user=request.user)
    entry = get_object_or_404(visible, pk=pk)
    act, done = ACTIONS[action]
    try:
        act(entry=entry, actor=request.user)
    except BookingError as error:
        messages.error(request, str(error))
    else:
        messages.success(request, done)
    return redirect(
        "waitlist-queue" if request.POST.get("next") == "queue" and request.user.is_booking_admin else "waitlist"
    )


@login_required
def queue_page(request: AuthenticatedHttpRequest) -> HttpResponse:
    if not request.user.is_booking_admin:
        return render(request, "waitlist/queue.html", {"nav": "waitlist", "forbidden": True}, status=403)
    return render(
        request, "waitlist/queue.html", {"nav": "waitlist", "queues": selectors.queue_by_node(now=timezone.now())}
    )


def _prefill(request: HttpRequest) -> dict[str, Any]:
    """What the calendar's refusal links with: ?gpus=1,2&start=...&end=... (ISO times)."""
    initial: dict[str, Any] = {}
    raw_gpus = request.GET.get("gpus", "")
    if raw_gpus:
        initial["gpus"] = [part for part in raw_gpus.split(",") if part.isdigit()][:64]
    for name, field in (("start", "earliest_start"), ("end", "latest_end")):
        moment = _parse(request.GET.get(name, ""))
        if moment is not None:
            initial[field] = timezone.localtime(moment)
    start, end = _parse(request.GET.get("start", "")), _parse(request.GET.get("end", ""))
    if start and end and end > start:
        minutes = int((end - start).total_seconds() // 60)
        if any(minutes == choice for choice, _ in JoinForm.base_fields["duration"].choices):  # type: ignore[attr-defined]
            initial["duration"] = minutes
    return initial


def _parse(raw: str) -> Any:
    try:
        moment = parse_datetime(raw) if raw else None
    except ValueError:
        return None
    return moment if moment is not None and timezone.is_aware(moment) else None


def _want(data: dict[str, Any]) -> services.Want:
    return services.Want(
        gpus=list(data.get("gpus") or []),
        node=None if data.get("gpus") else data.get("node"),
        count=data.get("count") or 1,
        earliest_start=data["earliest_start"],
        latest_end=data["latest_end"],
        duration=timedelta(minutes=data["duration"]),
        purpose=data.get("purpose", ""),
        auto_book=bool(data.get("auto_book")),
    )


def _joined(entry: Entry) -> str:
    if entry.status == Entry.Status.BOOKED:
        return f"It was free: booked as reservation #{entry.reservation_id}."
    if entry.status == Entry.Status.OFFERED:
        return "It was free: the slot is held for you below; claim it."
    return f"You are on the waitlist for {entry.want_text}."
