"""Times at the edges of the calendar (the years 1 and 9999, offsets no zone has) answer 400 in words.

Each of these inputs reached datetime arithmetic (the grid snap, a search horizon, a report's default
period, a reader's zone) and answered 500 (OverflowError). The rule (kernel/fields.py): the portal
takes times from 1970-01-01 to 2999-12-31 UTC, with offsets from -12:00 to +14:00. Every surface a
person or a script uses is tried here: the API with a token, the pages and admin with a session.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.test import Client
from django.urls import reverse

from reservations.models import Allocation, MaintenanceWindow, Reservation
from reservations.services import reservation_create
from tests.api_helpers import client_for
from tests.conftest import at

pytestmark = pytest.mark.usefixtures("clock")

CALENDAR_WORDS = "outside the dates the portal takes: give a time from 1970-01-01 to 2999-12-31 (UTC)"
OFFSET_WORDS = "is no time zone's: offsets run from -12:00 to +14:00"
# The three inputs of the issue, and their relatives: far future, far past, extreme offsets.
EDGE_TIMES = [
    ("9999-12-31T23:59:00Z", CALENDAR_WORDS),
    ("9999-12-31T23:59:59Z", CALENDAR_WORDS),
    ("9999-12-31T23:59:59-23:59", CALENDAR_WORDS),
    ("9999-12-30T00:00:00Z", CALENDAR_WORDS),
    ("0001-01-01T00:00:00Z", CALENDAR_WORDS),
    ("0001-01-01T00:00:00-05:00", CALENDAR_WORDS),
    ("0001-01-01T00:00:00+23:59", CALENDAR_WORDS),
    ("2030-01-07T12:00:00+23:59", "The offset +23:59 " + OFFSET_WORDS),
    ("2030-01-07T12:00:00-23:59", "The offset -23:59 " + OFFSET_WORDS),
    ("2030-01-07T12:00:00+99:00", "The offset +99:00 " + OFFSET_WORDS),
    ("2030-01-07T12:00:00+24:00", "The offset +24:00 " + OFFSET_WORDS),
]


def refused_in_words(response, field: str, words: str) -> None:
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "invalid"
    assert field in error["details"]["fields"], error
    assert words in error["message"], error["message"]


# --- the API ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "words"), EDGE_TIMES)
def test_booking_with_an_end_at_the_calendars_edge_is_a_400(alice, gpus, value, words):
    response = client_for(alice).post(
        "/api/v1/reservations/", {"gpus": [gpus[0].pk], "start": at(1).isoformat(), "end": value}, format="json"
    )
    refused_in_words(response, "end", words)
    assert not Reservation.objects.exists()


@pytest.mark.parametrize(("value", "words"), EDGE_TIMES)
def test_booking_by_node_and_count_at_the_calendars_edge_is_a_400(alice, gpus, value, words):
    # This path picks free GPUs on the grid before booking: the snap ran on the raw end.
    response = client_for(alice).post(
        "/api/v1/reservations/",
        {"node": "gpu-a100", "gpu_count": 1, "start": at(1).isoformat(), "end": value},
        format="json",
    )
    refused_in_words(response, "end", words)


@pytest.mark.parametrize("path", ["book", "extend"])
def test_a_booking_until_9999_also_names_how_far_ahead_one_may_book(alice, carol, gpus, path):
    """ "Until 9999" means "as long as I can": the refusal says how long that is, and whose number."""
    if path == "book":
        body, url = {"gpus": [gpus[0].pk], "start": at(1).isoformat(), "end": "9999-12-31T23:59:00Z"}, ""
    else:
        booking = reservation_create(user=alice, gpus=gpus[:1], start=at(1), end=at(2))
        body, url = {"end": "9999-12-31T23:59:59Z"}, f"{booking.pk}/extend/"

    response = client_for(alice).post(f"/api/v1/reservations/{url}", body, format="json")

    refused_in_words(response, "end", CALENDAR_WORDS)
    assert (
        "Bookings may end at most 90 days ahead (the site ceiling MAX_DAYS_AHEAD" in response.json()["error"]["message"]
    )
    admin = client_for(carol).post(f"/api/v1/reservations/{url}", body, format="json")
    assert "Bookings may end" not in admin.json()["error"]["message"]  # admins book past limits


def test_a_start_at_the_calendars_edge_is_a_400(alice, gpus):
    response = client_for(alice).post(
        "/api/v1/reservations/",
        {"gpus": [gpus[0].pk], "start": "9999-12-31T23:00:00Z", "end": "9999-12-31T23:59:00Z"},
        format="json",
    )
    refused_in_words(response, "start", CALENDAR_WORDS)


@pytest.mark.parametrize(("value", "words"), EDGE_TIMES)
def test_extending_to_the_calendars_edge_is_a_400_and_changes_nothing(alice, gpus, value, words):
    booking = reservation_create(user=alice, gpus=gpus[:1], start=at(1), end=at(2))
    response = client_for(alice).post(f"/api/v1/reservations/{booking.pk}/extend/", {"end": value}, format="json")
    refused_in_words(response, "end", words)
    booking.refresh_from_db()
    assert booking.end == at(2)


@pytest.mark.parametrize(("value", "words"), EDGE_TIMES)
def test_availability_after_the_calendars_edge_is_a_400(alice, gpus, value, words):
    response = client_for(alice).get("/api/v1/availability/", {"gpus": 1, "hours": 4, "after": value})
    refused_in_words(response, "after", words)


def test_availability_just_inside_the_calendar_still_answers(alice, gpus):
    response = client_for(alice).get(
        "/api/v1/availability/", {"gpus": 1, "hours": 1440, "after": "2999-12-31T23:59:59Z"}
    )
    assert response.status_code == 200, response.content
    # The search starts on the grid cell that holds "after"; it and the 60 days it reaches stay
    # within what datetime can count.
    assert response.json()["results"][0]["start"] == "2999-12-31T23:45:00Z"


@pytest.mark.parametrize("name", ["after", "before"])
@pytest.mark.parametrize(("value", "words"), EDGE_TIMES)
def test_list_filters_at_the_calendars_edge_are_a_400(alice, name, value, words):
    response = client_for(alice).get("/api/v1/reservations/", {name: value})
    refused_in_words(response, name, words)


@pytest.mark.parametrize(("value", "words"), EDGE_TIMES)
def test_calendar_ranges_at_the_calendars_edge_are_a_400(alice, node, value, words):
    response = client_for(alice).get("/api/v1/calendar/", {"start": value, "end": "2030-01-08T00:00:00Z"})
    refused_in_words(response, "start", words)


def test_an_unencoded_extreme_offset_in_the_calendars_range_is_named(alice, node):
    # A '+' left unencoded in a query string arrives as a space; the calendar reads it as '+'.
    response = client_for(alice).get("/api/v1/calendar/?start=2030-01-07T00:00:00 99:00&end=2030-01-08T00:00:00Z")
    refused_in_words(response, "start", "The offset +99:00 " + OFFSET_WORDS)


@pytest.mark.parametrize("path", ["/api/v1/reports/usage/", "/api/v1/reports/demand/"])
@pytest.mark.parametrize(("value", "words"), EDGE_TIMES)
def test_report_periods_at_the_calendars_edge_are_a_400(alice, path, value, words):
    # With only an end, the start defaults to 30 days before it: year 1 went below datetime's floor.
    response = client_for(alice).get(path, {"end": value})
    refused_in_words(response, "end", words)


def test_an_api_token_cannot_expire_past_the_calendar(alice):
    response = client_for(alice).post(
        "/api/v1/tokens/", {"name": "forever", "expires_at": "9999-12-31T23:59:59Z"}, format="json"
    )
    refused_in_words(response, "expires_at", CALENDAR_WORDS)


# --- the pages ---------------------------------------------------------------------------------


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def flashed(response) -> list[str]:
    return [str(message) for message in response.context["messages"]]


@pytest.mark.parametrize("zone", ["UTC", "Europe/Berlin", "Pacific/Kiritimati", "America/Los_Angeles"])
@pytest.mark.parametrize("value", ["9999-12-31T23:59", "0001-01-01T00:00"])
def test_the_extend_form_refuses_a_new_end_at_the_calendars_edge(alice, gpus, zone, value):
    alice.timezone = zone
    alice.save()
    booking = reservation_create(user=alice, gpus=gpus[:1], start=at(1), end=at(2))
    response = logged_in(alice).post(
        reverse("reservation-action", kwargs={"pk": booking.pk, "action": "extend"}), {"end": value}, follow=True
    )
    assert response.status_code == 200
    [message] = flashed(response)
    assert message.startswith(f"New end: {value}:00")
    assert message.endswith(CALENDAR_WORDS + ".")
    booking.refresh_from_db()
    assert booking.end == at(2)


def test_extending_by_hours_a_booking_that_already_ends_at_the_calendars_edge_is_refused(alice, gpus):
    # Written before the portal kept to its calendar (the services refuse such an end now).
    booking = Reservation.objects.create(
        user=alice, node=gpus[0].node, start=at(1), end=datetime(9999, 12, 31, 23, 45, tzinfo=UTC)
    )
    Allocation.objects.create(reservation=booking, gpu=gpus[0], start=booking.start, end=booking.end)
    response = logged_in(alice).post(
        reverse("reservation-action", kwargs={"pk": booking.pk, "action": "extend"}), {"hours": "4"}, follow=True
    )
    assert response.status_code == 200
    assert flashed(response) == ["This booking ends outside the dates the portal takes: it cannot be extended."]


@pytest.mark.parametrize("url", ["/reports/", "/reports/usage.csv"])
@pytest.mark.parametrize("day", ["9999-12-31", "0001-01-01"])
def test_the_reports_page_refuses_a_day_at_the_calendars_edge(alice, url, day):
    alice.timezone = "Pacific/Kiritimati"  # +14:00: midnight of 0001-01-01 there is before year 1 in UTC
    alice.save()
    response = logged_in(alice).get(url, {"start": day, "end": day})
    assert response.status_code == 400
    assert f"{day} is outside the dates the portal takes: give a day from 1970-01-01 to 2999-12-31 (UTC)." in (
        response.content.decode()
    )


# --- admin -------------------------------------------------------------------------------------


@pytest.fixture
def admin_client(carol) -> Client:
    return logged_in(carol)


def split(moment: str) -> tuple[str, str]:
    day, time = moment.split("T")
    return day, time


@pytest.mark.parametrize("value", ["9999-12-31T23:59", "0001-01-01T00:00"])
def test_admin_booking_at_the_calendars_edge_is_a_form_error(admin_client, alice, gpus, value):
    day, time = split(value)
    response = admin_client.post(
        reverse("admin:reservations_reservation_add"),
        {
            "user": alice.pk,
            "gpus": [gpus[0].pk],
            "start_0": "2030-01-07",
            "start_1": "10:00",
            "end_0": day,
            "end_1": time,
            "purpose": "",
        },
    )
    assert response.status_code == 200  # the form again, with the error
    assert "outside the dates the portal takes" in response.content.decode()
    assert not Reservation.objects.exists()


@pytest.mark.parametrize("value", ["9999-12-31T23:59", "0001-01-01T00:00"])
def test_admin_maintenance_window_at_the_calendars_edge_is_a_form_error(admin_client, carol, node, value):
    carol.timezone = "Europe/Berlin"
    carol.save()
    day, time = split(value)
    response = admin_client.post(
        reverse("admin:reservations_maintenancewindow_add"),
        {"node": node.pk, "start_0": "2030-01-07", "start_1": "10:00", "end_0": day, "end_1": time, "reason": ""},
    )
    assert response.status_code == 200
    assert "outside the dates the portal takes" in response.content.decode()
    assert not MaintenanceWindow.objects.exists()
