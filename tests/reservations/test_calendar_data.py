"""The calendar page and its data endpoint, GET /api/v1/calendar/."""

from __future__ import annotations

import gzip
import json
from datetime import timedelta

import pytest
from django.test import Client
from django.urls import reverse

from nodes.models import Node
from reservations.calendar_format import gpu_label, utc_offset
from reservations.models import MaintenanceWindow, Reservation
from reservations.services import reservation_cancel, reservation_create, reservation_reject, reservation_release
from tests.api_helpers import client_for
from tests.conftest import MONDAY_9, at
from tests.factories import GpuFactory, UserFactory, node_with_gpus

pytestmark = pytest.mark.usefixtures("clock")
URL = "/api/v1/calendar/"
DAY = {"start": at(-9).isoformat(), "end": at(15).isoformat()}  # Monday 00:00 to Tuesday 00:00 UTC


def calendar(user, **params):
    response = client_for(user).get(URL, params or DAY)
    assert response.status_code == 200, response.content
    return response.json()


def bookings(data):
    return [event for event in data["events"] if event["extendedProps"]["kind"] == "reservation"]


def only_booking(data):
    (event,) = bookings(data)
    return event


# --- rows -----------------------------------------------------------------------------------


def test_rows_are_nodes_with_their_gpus_as_children(alice, node, gpus):
    GpuFactory(node=node_with_gpus(0, name="gpu-h100"), index=0, model="NVIDIA H100 80GB HBM3", memory_mib=81559)

    data = calendar(alice)

    assert [row["title"] for row in data["resources"]] == ["gpu-a100", "gpu-h100"]
    a100 = data["resources"][0]
    assert a100["id"] == f"node-{node.pk}"
    assert a100["extendedProps"] == {
        "kind": "node", "node": "gpu-a100", "status": "active", "bookable": True, "whole_node": False
    }  # fmt: skip
    assert [child["id"] for child in a100["children"]] == [f"gpu-{gpu.pk}" for gpu in gpus]
    assert a100["children"][0]["title"] == "GPU 0 · A100-SXM4 80 GB"
    assert a100["children"][0]["extendedProps"] == {
        "kind": "gpu",
        "gpu": gpus[0].pk,
        "node": "gpu-a100",
        "index": 0,
        "label": "GPU 0 · A100-SXM4 80 GB",
        "bookable": True,
    }
    assert data["resources"][1]["children"][0]["title"] == "GPU 0 · H100 80 GB"
    assert data["now"] == "2030-01-07T09:00:00+00:00"


def test_rows_say_when_a_node_or_gpu_takes_no_bookings(alice, node, gpus):
    Node.objects.filter(pk=node.pk).update(status=Node.Status.MAINTENANCE)
    gpus[1].bookable = False
    gpus[1].save()

    (row,) = calendar(alice)["resources"]

    assert row["title"] == "gpu-a100 (in maintenance)"
    assert row["extendedProps"]["bookable"] is False
    assert row["children"][1]["title"] == "GPU 1 · A100-SXM4 80 GB (not bookable)"
    assert row["children"][1]["extendedProps"]["bookable"] is False


@pytest.mark.parametrize(
    ("model", "memory_mib", "label"),
    [
        ("NVIDIA A100-SXM4-80GB", 81920, "GPU 3 · A100-SXM4 80 GB"),
        ("NVIDIA H100 80GB HBM3", 81559, "GPU 3 · H100 80 GB"),
        ("NVIDIA L40S", 46068, "GPU 3 · L40S 45 GB"),
        ("Tesla V100-PCIE-32GB", 32768, "GPU 3 · Tesla V100-PCIE 32 GB"),
        ("Slurm GPU (a100)", 0, "GPU 3 · Slurm GPU (a100)"),  # counted by Slurm, size unknown
    ],
)
def test_gpu_labels_name_the_model_and_memory(model, memory_mib, label):
    assert gpu_label(3, model, memory_mib) == label


# --- bookings -------------------------------------------------------------------------------


def test_a_booking_is_one_event_on_all_its_gpus_with_the_holders_name(alice, bob, gpus):
    taken = reservation_create(user=bob, gpus=gpus[1:3], start=at(1), end=at(3), purpose="secret project")

    event = only_booking(calendar(alice))

    assert event["id"] == f"reservation-{taken.pk}"
    assert event["resourceIds"] == [f"gpu-{gpus[1].pk}", f"gpu-{gpus[2].pk}"]
    assert (event["start"], event["end"]) == ("2030-01-07T10:00:00+00:00", "2030-01-07T12:00:00+00:00")
    assert event["title"] == "bob"
    assert event["classNames"] == ["approved"]
    assert event["editable"] is False
    assert event["extendedProps"] == {
        "kind": "reservation",
        "reservation": taken.pk,
        "status": "approved",
        "mine": False,
        "purpose": None,
        "can_cancel": False,
        "can_release": False,
        "can_extend": False,
        "extends": None,
        "url": None,
    }


def test_others_never_see_the_purpose_but_the_holder_and_admins_do(alice, bob, carol, gpus):
    reservation_create(user=bob, gpus=gpus[:1], start=at(1), end=at(3), purpose="secret project")

    assert only_booking(calendar(alice))["extendedProps"]["purpose"] is None
    assert only_booking(calendar(bob))["extendedProps"]["purpose"] == "secret project"
    assert only_booking(calendar(carol))["extendedProps"]["purpose"] == "secret project"
    assert b"secret project" not in client_for(alice).get(URL, DAY).content


def test_your_upcoming_booking_can_be_cancelled_and_extended(alice, gpus):
    reservation_create(user=alice, gpus=gpus[:1], start=at(1), end=at(3), purpose="training")

    event = only_booking(calendar(alice))

    assert event["classNames"] == ["approved", "mine"]
    assert event["editable"] is True
    props = event["extendedProps"]
    assert (props["mine"], props["purpose"]) == (True, "training")
    assert (props["can_cancel"], props["can_release"], props["can_extend"]) == (True, False, True)


def test_a_running_booking_can_be_released_not_cancelled_except_by_an_admin(alice, carol, gpus, clock):
    reservation_create(user=alice, gpus=gpus[:1], start=at(1), end=at(3))
    clock.shift(timedelta(hours=2))

    mine = only_booking(calendar(alice))["extendedProps"]
    as_admin = only_booking(calendar(carol))["extendedProps"]

    assert (mine["can_cancel"], mine["can_release"], mine["can_extend"]) == (False, True, True)
    assert (as_admin["mine"], as_admin["can_cancel"], as_admin["can_release"], as_admin["can_extend"]) == (
        False,
        True,
        True,
        True,
    )


def test_a_past_booking_offers_no_action(alice, gpus, clock):
    reservation_create(user=alice, gpus=gpus[:1], start=at(1), end=at(3))
    clock.shift(timedelta(hours=5))

    event = only_booking(calendar(alice))

    assert not any(event["extendedProps"][name] for name in ("can_cancel", "can_release", "can_extend"))
    assert event["editable"] is False


def test_a_released_booking_ends_at_the_second_it_was_released(alice, gpus, clock):
    reservation = reservation_create(user=alice, gpus=gpus[:1], start=at(1), end=at(3))
    clock.shift(timedelta(hours=1, minutes=20, seconds=17))
    reservation_release(reservation=reservation, actor=alice)

    event = only_booking(calendar(alice))

    assert (event["start"], event["end"]) == ("2030-01-07T10:00:00+00:00", "2030-01-07T10:20:17+00:00")
    assert not any(event["extendedProps"][name] for name in ("can_cancel", "can_release", "can_extend"))


def test_times_with_fractions_of_a_second_keep_them(alice, gpus):
    reservation = reservation_create(user=alice, gpus=gpus[:1], start=at(1), end=at(3))
    Reservation.objects.filter(pk=reservation.pk).update(end=at(2.5) + timedelta(microseconds=250))

    assert only_booking(calendar(alice))["end"] == "2030-01-07T11:30:00.000250+00:00"


def test_cancelled_and_rejected_bookings_are_not_shown(alice, bob, carol, gpus):
    Node.objects.update(requires_approval=True)
    cancelled = reservation_create(user=bob, gpus=gpus[:1], start=at(1), end=at(3))
    reservation_cancel(reservation=cancelled, actor=bob)
    rejected = reservation_create(user=bob, gpus=gpus[1:2], start=at(1), end=at(3))
    reservation_reject(reservation=rejected, actor=carol, reason="not this week")
    live = reservation_create(user=bob, gpus=gpus[2:3], start=at(1), end=at(3))

    for viewer in (alice, bob, carol):
        assert [event["extendedProps"]["reservation"] for event in bookings(calendar(viewer))] == [live.pk]


def test_a_pending_booking_is_flagged(alice, bob, gpus):
    Node.objects.update(requires_approval=True)
    reservation_create(user=bob, gpus=gpus[:1], start=at(1), end=at(3))

    event = only_booking(calendar(alice))

    assert event["classNames"] == ["pending"]
    assert event["extendedProps"]["status"] == "pending"


def test_only_bookings_overlapping_the_range_are_sent(alice, gpus):
    before = reservation_create(user=alice, gpus=gpus[:1], start=at(1), end=at(2))
    inside = reservation_create(user=alice, gpus=gpus[:1], start=at(3), end=at(5))
    across_the_end = reservation_create(user=alice, gpus=gpus[1:2], start=at(6), end=at(9))
    after = reservation_create(user=alice, gpus=gpus[:1], start=at(7), end=at(8))

    data = calendar(alice, start=at(2).isoformat(), end=at(7).isoformat())

    shown = [event["extendedProps"]["reservation"] for event in bookings(data)]
    assert shown == [inside.pk, across_the_end.pk]
    assert before.pk not in shown and after.pk not in shown  # they only touch the range's edges


def test_the_range_may_be_given_in_any_offset(alice, gpus):
    reservation_create(user=alice, gpus=gpus[:1], start=at(1), end=at(2))

    berlin = calendar(alice, start="2030-01-07T11:00:00+01:00", end="2030-01-07T12:00:00+01:00")
    assert len(bookings(berlin)) == 1
    assert bookings(berlin)[0]["start"] == "2030-01-07T10:00:00+00:00"


def test_a_plus_left_unencoded_in_the_query_string_still_reads_as_an_offset(alice, gpus):
    reservation_create(user=alice, gpus=gpus[:1], start=at(1), end=at(2))

    response = client_for(alice).get(f"{URL}?start=2030-01-07T11:00:00+01:00&end=2030-01-07T12:00:00+01:00")

    assert response.status_code == 200, response.json()
    assert len(bookings(response.json())) == 1


def test_the_node_filter_keeps_one_nodes_rows_and_events(alice, gpus):
    other = node_with_gpus(2, name="gpu-h100")
    reservation_create(user=alice, gpus=gpus[:1], start=at(1), end=at(2))
    theirs = reservation_create(user=alice, gpus=list(other.gpus.all()[:1]), start=at(1), end=at(2))

    data = calendar(alice, **DAY, node="gpu-h100")

    assert [row["title"] for row in data["resources"]] == ["gpu-h100"]
    assert [event["extendedProps"]["reservation"] for event in bookings(data)] == [theirs.pk]


# --- maintenance ----------------------------------------------------------------------------


def test_maintenance_windows_are_background_events_on_their_rows(alice, node, gpus):
    whole = MaintenanceWindow.objects.create(node=node, start=at(2), end=at(4), reason="BIOS update")
    one = MaintenanceWindow.objects.create(node=node, gpu=gpus[2], start=at(5), end=at(6))
    MaintenanceWindow.objects.create(node=node, start=at(30), end=at(31), reason="outside the range")

    events = [event for event in calendar(alice)["events"] if event["extendedProps"]["kind"] == "maintenance"]

    assert events == [
        {
            "id": f"maintenance-{whole.pk}",
            "resourceIds": [f"node-{node.pk}", *(f"gpu-{gpu.pk}" for gpu in gpus)],
            "start": "2030-01-07T11:00:00+00:00",
            "end": "2030-01-07T13:00:00+00:00",
            "title": "Maintenance: BIOS update",
            "display": "background",
            "classNames": ["maintenance"],
            "extendedProps": {"kind": "maintenance", "maintenance": whole.pk, "node": "gpu-a100", "gpu": None},
        },
        {
            "id": f"maintenance-{one.pk}",
            "resourceIds": [f"gpu-{gpus[2].pk}"],
            "start": "2030-01-07T14:00:00+00:00",
            "end": "2030-01-07T15:00:00+00:00",
            "title": "Maintenance",
            "display": "background",
            "classNames": ["maintenance"],
            "extendedProps": {"kind": "maintenance", "maintenance": one.pk, "node": "gpu-a100", "gpu": gpus[2].pk},
        },
    ]


# --- refusals -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("params", "field", "words"),
    [
        ({"start": "2030-01-07T00:00:00", "end": "2030-01-08T00:00:00Z"}, "start", "Give the time zone"),
        ({"start": "2030-01-08T00:00:00Z", "end": "2030-01-07T00:00:00Z"}, "end", "must be after the start"),
        ({"start": "2030-01-07T00:00:00Z", "end": "2030-01-07T00:00:00Z"}, "end", "must be after the start"),
        ({"start": "2030-01-01T00:00:00Z", "end": "2030-03-05T00:00:00Z"}, "end", "63 days long; ask for at most 62"),
        ({"start": "last monday", "end": "2030-01-08T00:00:00Z"}, "start", "wrong format"),
        ({"end": "2030-01-08T00:00:00Z"}, "start", "required"),
        ({**DAY, "node": "no-such-node"}, "node", "No node named 'no-such-node'"),
    ],
)
def test_a_bad_range_is_a_400_saying_what_is_wrong(alice, params, field, words):
    response = client_for(alice).get(URL, params)

    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid"
    assert words in error["message"]
    assert error["message"].startswith(f"Invalid input — {field}: ")
    assert field in error["details"]["fields"]


def test_the_answer_is_gzipped_for_clients_that_accept_it(alice, gpus):
    reservation_create(user=alice, gpus=gpus[:1], start=at(1), end=at(3))

    response = client_for(alice).get(URL, DAY, HTTP_ACCEPT_ENCODING="gzip")

    assert response.status_code == 200
    assert response["Content-Encoding"] == "gzip"
    assert len(bookings(json.loads(gzip.decompress(response.content)))) == 1


def test_anonymous_callers_get_a_401(db):
    response = client_for(None).get(URL, DAY)

    assert response.status_code == 401
    assert response.json()["error"]["code"] == "not_authenticated"


def test_the_page_session_is_enough(alice, gpus):
    client = Client()
    client.force_login(alice)

    response = client.get(URL, DAY)

    assert response.status_code == 200
    assert response.json()["resources"][0]["title"] == "gpu-a100"


# --- cost -----------------------------------------------------------------------------------


def test_the_answer_costs_the_same_few_queries_whatever_the_number_of_bookings(
    alice, gpus, django_assert_max_num_queries
):
    client = client_for(alice)
    client.get(URL, DAY)  # warm up: the token's last-used write
    week = {"start": at(-9).isoformat(), "end": at(-9, days=7).isoformat()}
    people = [UserFactory(username=f"user{i}") for i in range(6)]
    for hour in range(0, 150, 2):
        for gpu in gpus:
            owner = people[(hour + gpu.index) % len(people)]
            reservation_create(user=owner, gpus=[gpu], start=at(hour + 1), end=at(hour + 3))
    MaintenanceWindow.objects.create(node=gpus[0].node, start=at(160), end=at(161))

    # token lookup, nodes, GPUs, allocations, reservations, maintenance windows, reserved capacity
    with django_assert_max_num_queries(7):
        response = client.get(URL, week)

    assert response.status_code == 200
    assert len(bookings(response.json())) == 75 * 4


# --- the page -------------------------------------------------------------------------------


def test_the_page_sends_anonymous_visitors_to_the_login(db):
    response = Client().get("/")

    assert response.status_code == 302
    assert response["Location"] == f"{reverse('login')}?next=/"


def test_the_page_carries_its_config_and_the_vendored_calendar(alice, node):
    alice.timezone = "Europe/Berlin"
    alice.save()
    client = Client()
    client.force_login(alice)

    response = client.get("/")

    assert response.status_code == 200
    html = response.content.decode()
    assert '<script src="/static/vendor/event-calendar/event-calendar.min.js"></script>' in html
    assert '<script src="/static/js/calendar.js"></script>' in html
    assert 'href="/static/vendor/event-calendar/event-calendar.min.css"' in html
    for anchor in ('id="booking-dialog"', 'id="reservation-dialog"', 'id="booking-purpose"', 'id="calendar-status"'):
        assert anchor in html
    assert "Europe/Berlin" in html
    config = json.loads(html.split('<script id="calendar-config" type="application/json">')[1].split("</script>")[0])
    assert config["urls"] == {
        "calendar": "/api/v1/calendar/",
        "reservations": "/api/v1/reservations/",
        "series": "/api/v1/series/",
        "waitlist": "/waitlist/",
        "suggest": "/api/v1/availability/suggest/",
        "length_advice": "/api/v1/me/length-advice/",
    }
    assert config["user"] == "alice"
    assert config["is_admin"] is False
    assert config["grid_minutes"] == 15
    assert config["time_zone"] == {"name": "Europe/Berlin", "offset": "+01:00"}  # January: CET
    assert config["csrf_token"]
    assert [row["title"] for row in config["resources"]] == ["gpu-a100"]


@pytest.mark.parametrize(
    ("zone", "offset"),
    [("UTC", "+00:00"), ("Europe/Berlin", "+01:00"), ("Asia/Kolkata", "+05:30"), ("America/St_Johns", "-03:30")],
)
def test_the_calendar_gets_the_offset_the_users_zone_has_now(zone, offset):
    assert utc_offset(zone, MONDAY_9) == offset


def test_in_summer_the_offset_follows_daylight_saving_time():
    assert utc_offset("Europe/Berlin", MONDAY_9 + timedelta(days=180)) == "+02:00"
