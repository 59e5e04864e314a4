"""The status page: every GPU's card, kept fresh over the websocket (static/js/status.js)."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone

from nodes.ingest import event_data
from nodes.models import NodeEvent
from reservations.fleet import fleet_status, for_viewer

RECENT_EVENTS = 30


@login_required
def status_page(request: HttpRequest) -> HttpResponse:
    user: Any = request.user
    admin = user.is_booking_admin
    now = timezone.now()
    config: dict[str, Any] = {
        "urls": {"websocket": "/ws/live/", "status": reverse("api:status"), "calendar": reverse("calendar")},
        "time_zone": timezone.get_current_timezone_name(),
        "is_admin": admin,
        # The first paint comes with the page; the websocket's snapshot then replaces it.
        "status": {"now": now.isoformat(), "nodes": for_viewer(fleet_status(now=now, history=True), admin=admin)},
        "events": [event_data(e) | {"node": e.node.name} for e in _recent_events()] if admin else [],
    }
    return render(request, "live/status.html", {"nav": "status", "config": config})


def _recent_events() -> list[NodeEvent]:
    return list(NodeEvent.objects.select_related("node", "gpu").order_by("-at", "-pk")[:RECENT_EVENTS])
