"""Open calendars hear of reserved capacity: a window an admin saves (or whose GPUs change) makes the node's
calendars reload, and a released occurrence is announced with its period so that its band goes."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.utils import timezone

from reservations.models import ReservedCapacity
from reservations.reserved_release import reserved_release_due
from tests.live.server import open_client

pytestmark = pytest.mark.postgres_only


def test_a_reserved_window_saved_by_an_admin_reloads_the_nodes_calendars(asgi_server, live_lab):
    watcher = open_client(asgi_server, token=live_lab["researcher_token"])
    watcher.subscribe("calendar")
    now = timezone.now()
    window = ReservedCapacity.objects.create(
        group=Group.objects.create(name="vision"), node=live_lab["node"], start=now, end=now + timedelta(hours=1)
    )
    change = watcher.wait_for(lambda m: m["type"] == "calendar")
    assert (change["node"], change["start"], change["end"]) == ("live-a100", None, None)

    window.gpus.set([live_lab["gpus"][0]])
    assert watcher.wait_for(lambda m: m["type"] == "calendar")["node"] == "live-a100"
    watcher.close()


def test_a_released_occurrence_is_announced_with_its_period(asgi_server, live_lab):
    start = timezone.now().replace(microsecond=0) + timedelta(hours=1)
    ReservedCapacity.objects.create(
        group=Group.objects.create(name="vision"),
        node=live_lab["node"],
        count=1,
        start=start,
        end=start + timedelta(hours=2),
        release_hours_before=2,
    )
    watcher = open_client(asgi_server, token=live_lab["researcher_token"])
    watcher.subscribe("calendar")

    assert reserved_release_due() == 1

    change = watcher.wait_for(lambda m: m["type"] == "calendar" and m["start"] is not None)
    assert change["node"] == "live-a100"
    assert (change["start"], change["end"]) == (start.isoformat(), (start + timedelta(hours=2)).isoformat())
    watcher.close()
