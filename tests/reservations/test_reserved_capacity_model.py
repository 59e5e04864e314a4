"""Reserved capacity counted by GPU model, on any node: "3 of our H100s, whichever, on Monday mornings"."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.urls import reverse
from django.utils import timezone

from reservations.calendar_data import calendar_events, calendar_resources
from reservations.exceptions import ReservedConflict
from reservations.models import ReservedCapacity
from reservations.services import reservation_create
from reservations.tasks import release_reserved_capacity
from tests.conftest import at
from tests.factories import UserFactory, node_with_gpus
from waitlist.models import Entry
from waitlist.services import Want, entry_join

pytestmark = pytest.mark.usefixtures("clock")
H100 = "NVIDIA H100 80GB HBM3"


@pytest.fixture
def lab(alice):
    """Two nodes with H100s (3 and 2), one with another model; the group vision (alice) keeps 4 H100s."""
    vision = Group.objects.create(name="vision")
    alice.groups.add(vision)
    first, second = node_with_gpus(3, name="h100-a"), node_with_gpus(2, name="h100-b")
    for node in (first, second):
        node.gpus.update(model=H100)
    other = node_with_gpus(2, name="gpu-4090")
    window = ReservedCapacity.objects.create(group=vision, gpu_model=H100, count=4, start=at(1), end=at(4))
    return {"vision": vision, "first": first, "second": second, "other": other, "window": window}


def gpus_of(node):
    return list(node.gpus.order_by("index"))


def test_non_members_share_what_is_left_of_the_model_across_nodes(lab, alice, bob):
    first, second, other = gpus_of(lab["first"]), gpus_of(lab["second"]), gpus_of(lab["other"])
    reservation_create(user=bob, gpus=[first[0]], start=at(1), end=at(2))  # 5 H100s - 4 kept = 1 for others
    with pytest.raises(ReservedConflict) as refused:
        reservation_create(user=bob, gpus=[second[0]], start=at(1), end=at(2))
    assert str(refused.value).startswith(f"4 of the 5 GPUs of model {H100} are reserved for group vision")
    assert refused.value.code == "reserved" and refused.value.details["reserved"]["model"] == H100
    reservation_create(user=bob, gpus=other, start=at(1), end=at(2))  # another model: not counted
    reservation_create(user=bob, gpus=[second[0]], start=at(4), end=at(5))  # after the window
    reservation_create(user=alice, gpus=[first[1], first[2]], start=at(1), end=at(2))  # a member: not counted
    reservation_create(user=alice, gpus=[second[1]], start=at(1), end=at(2))


def test_the_band_is_on_every_node_with_the_model(lab, bob):
    now = timezone.now()
    resources = calendar_resources()
    events = calendar_events(user=bob, start=at(0), end=at(6), now=now, resources=resources)
    (band,) = [event for event in events if event["extendedProps"].get("kind") == "reserved"]
    assert band["title"] == f"4 GPUs of model {H100} reserved for vision"
    assert band["resourceIds"] == [f"node-{lab['first'].pk}", f"node-{lab['second'].pk}"]
    assert band["extendedProps"]["node"] is None and band["extendedProps"]["model"] == H100


def test_a_released_model_window_is_offered_to_the_waitlist_on_whichever_node(
    lab, bob, clock, django_capture_on_commit_callbacks
):
    window = lab["window"]
    window.start, window.end, window.release_hours_before = at(2), at(5), 1
    window.save()
    second = gpus_of(lab["second"])
    reservation_create(user=bob, gpus=[gpus_of(lab["first"])[0]], start=at(2), end=at(5))  # the one H100 left
    want = Want(node=lab["second"], count=1, earliest_start=at(2), latest_end=at(5), duration=timedelta(hours=3))
    entry = entry_join(user=UserFactory(username="dave"), want=want)
    assert entry.status == Entry.Status.WAITING  # the model's last unreserved H100 is bob's

    clock.move_to(at(1) + timedelta(minutes=1))  # an hour before: released
    with django_capture_on_commit_callbacks(execute=True):
        assert release_reserved_capacity() == 1
    entry.refresh_from_db()
    assert entry.status == Entry.Status.BOOKED
    assert entry.reservation.allocations.get().gpu in second


def test_admin_takes_a_count_of_a_model_without_a_node_and_says_what_is_missing(lab, client, carol):
    client.force_login(carol)
    base = {
        "group": lab["vision"].pk,
        "label": "",
        "start_0": "2030-01-07",
        "start_1": "10:00:00",
        "end_0": "2030-01-07",
        "end_1": "13:00:00",
        "rule": "",
        "zone": "",
        "release_hours_before": "",
        "releases-TOTAL_FORMS": "0",
        "releases-INITIAL_FORMS": "0",
        "releases-MIN_NUM_FORMS": "0",
        "releases-MAX_NUM_FORMS": "1000",
    }
    url = reverse("admin:reservations_reservedcapacity_add")
    missing = client.post(url, base | {"count": "2", "gpu_model": ""}).content.decode()
    assert "Choose the node, or give a count and a GPU model" in missing
    too_many = client.post(url, base | {"count": "6", "gpu_model": H100}).content.decode()
    assert f"model {H100} has 5 bookable GPUs: reserve at most 5 of them." in too_many
    assert ReservedCapacity.objects.count() == 1
    saved = client.post(url, base | {"count": "2", "gpu_model": H100})
    assert saved.status_code == 302
    assert str(ReservedCapacity.objects.latest("pk")) == f"2 GPUs of model {H100} for vision"
