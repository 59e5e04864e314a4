"""The series API: create with preview, the per-occurrence report, errors as the kernel shapes them,
cancel scopes, book-within-reach, and who may see a series (others get 404)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from reservations.models import Limit, Reservation, Series
from tests.api_helpers import client_for
from tests.conftest import at
from tests.factories import book

URL = "/api/v1/series/"


def ask(gpus, **extra):
    return {
        "gpus": [gpus[0].pk],
        "start": at().isoformat(),
        "end": at(hours=2).isoformat(),
        "repeat": "FREQ=WEEKLY;COUNT=3",
        "timezone": "UTC",
        **extra,
    }


def test_preview_then_book_a_series(alice, bob, gpus, clock):
    book(bob, [gpus[0]], at(days=7), at(days=7, hours=1))
    api = client_for(alice)
    preview = api.post(URL, ask(gpus, preview=True, mode="skip"), format="json")
    assert preview.status_code == 200
    assert [o["outcome"] for o in preview.json()["report"]["occurrences"]] == ["bookable", "refused", "bookable"]
    assert preview.json()["series"] is None and not Series.objects.exists()

    created = api.post(URL, ask(gpus, mode="skip", purpose="training"), format="json")
    assert created.status_code == 201, created.json()
    body = created.json()
    assert body["report"]["summary"] == "2 of 3 occurrences were booked, 1 refused."
    assert body["series"]["rule"] == "FREQ=WEEKLY;COUNT=3" and body["series"]["timezone"] == "UTC"
    detail = api.get(f"{URL}{body['series']['id']}/").json()
    assert [o["state"] for o in detail["occurrences"]] == ["approved", "not_booked", "approved"]
    booked = api.get(f"/api/v1/reservations/{detail['occurrences'][0]['reservation']}/").json()
    assert booked["series"] == body["series"]["id"]


def test_all_or_nothing_conflict_is_a_409_with_the_report(alice, bob, gpus, clock):
    book(bob, [gpus[0]], at(days=14), at(days=14, hours=1))
    response = client_for(alice).post(URL, ask(gpus), format="json")
    assert response.status_code == 409
    error = response.json()["error"]
    assert error["code"] == "series_conflict"
    assert "so none was (all or nothing)" in error["message"]
    assert [o["outcome"] for o in error["details"]["occurrences"]] == ["held_back", "held_back", "refused"]
    assert not Reservation.objects.filter(user=alice).exists()


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        ({"repeat": "FREQ=DAILY"}, "repeat", "must end"),
        ({"repeat": "FREQ=MINUTELY;COUNT=5"}, "repeat", "more than once a day"),
        ({"timezone": "Nowhere/Town"}, "timezone", "Unknown time zone"),
        ({"mode": "maybe"}, "mode", "not a valid choice"),
    ],
)
def test_bad_input_is_a_400_with_a_message(alice, gpus, clock, change, field, words):
    response = client_for(alice).post(URL, ask(gpus, **change), format="json")
    assert response.status_code == 400
    error = response.json()["error"]
    assert words in error["message"] or words in str(error["details"])
    assert error["details"].get("field", field) == field or field in error["details"].get("fields", {})
    assert not Series.objects.exists()


def test_others_get_404_and_admins_see_all(alice, bob, carol, gpus, clock):
    series_id = client_for(alice).post(URL, ask(gpus), format="json").json()["series"]["id"]
    assert client_for(bob).get(f"{URL}{series_id}/").status_code == 404
    assert client_for(bob).post(f"{URL}{series_id}/cancel/", {"scope": "all"}, format="json").status_code == 404
    assert client_for(bob).get(URL).json()["results"] == []
    assert [s["id"] for s in client_for(carol).get(URL).json()["results"]] == [series_id]
    assert client_for(carol).get(f"{URL}{series_id}/").status_code == 200


def test_cancel_following_and_book_within_reach(alice, gpus, clock):
    Limit.objects.create(scope=Limit.Scope.USER, user=alice, max_days_ahead=10)
    api = client_for(alice)
    body = api.post(URL, ask(gpus, repeat="FREQ=WEEKLY;COUNT=4"), format="json").json()
    assert [o["outcome"] for o in body["report"]["occurrences"]] == ["booked", "booked", "later", "later"]
    series_id = body["series"]["id"]
    clock.shift(timedelta(days=7))
    reached = api.post(f"{URL}{series_id}/book-within-reach/", {}, format="json")
    assert reached.status_code == 200
    assert [o["outcome"] for o in reached.json()["report"]["occurrences"]] == ["booked", "later"]
    cancelled = api.post(f"{URL}{series_id}/cancel/", {"scope": "following", "from": "2030-01-21"}, format="json")
    assert cancelled.status_code == 200
    assert [o["state"] for o in cancelled.json()["occurrences"]] == ["approved", "approved", "cancelled", "cancelled"]
    missing_day = api.post(f"{URL}{series_id}/cancel/", {"scope": "following"}, format="json")
    assert missing_day.status_code == 400 and "from which occurrence" in missing_day.json()["error"]["message"]


def test_edit_the_time_of_day_from_an_occurrence(alice, gpus, clock):
    api = client_for(alice)
    series_id = api.post(
        URL, ask(gpus, start=at(hours=1).isoformat(), end=at(hours=2).isoformat()), format="json"
    ).json()["series"]["id"]
    edited = api.post(f"{URL}{series_id}/edit/", {"from": "2030-01-14", "start_time": "15:00"}, format="json")
    assert edited.status_code == 200, edited.json()
    starts = [o["start"] for o in api.get(f"{URL}{series_id}/").json()["occurrences"]]
    assert starts == ["2030-01-07T10:00:00Z", "2030-01-14T15:00:00Z", "2030-01-21T15:00:00Z"]


def test_the_schema_lists_the_series_endpoints(alice):
    from django.test import Client

    schema = Client().get("/api/schema/?format=json").json()
    assert {"/api/v1/series/", "/api/v1/series/{id}/cancel/", "/api/v1/series/{id}/book-within-reach/"} <= set(
        schema["paths"]
    )
