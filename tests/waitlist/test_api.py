"""The waitlist over the REST API and the command line."""

from __future__ import annotations

import pytest

from reservations.models import Reservation
from tests.api_helpers import client_for
from tests.conftest import at
from tests.factories import book
from waitlist.models import Entry

pytestmark = pytest.mark.usefixtures("clock")
URL = "/api/v1/waitlist/"


def iso(hours: float) -> str:
    return at(hours).isoformat()


def join_body(gpus, **fields):
    return {
        "gpus": [gpu.pk for gpu in gpus],
        "earliest_start": iso(1),
        "latest_end": iso(3),
        "duration_minutes": 120,
    } | fields


def test_join_list_claim_over_the_api(alice, bob, gpus, django_capture_on_commit_callbacks):
    taken = book(bob, [gpus[0]], at(1), at(3))
    refused = client_for(alice).post(
        "/api/v1/reservations/", {"gpus": [gpus[0].pk], "start": iso(1), "end": iso(3)}, format="json"
    )
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "slot_conflict"

    joined = client_for(alice).post(URL, join_body([gpus[0]], auto_book=False), format="json")
    assert joined.status_code == 201, joined.json()
    entry = joined.json()
    assert (entry["status"], entry["position"], entry["want"]) == ("waiting", 1, "gpu-a100/GPU 0 for 2 h")

    with django_capture_on_commit_callbacks(execute=True):
        assert client_for(bob).post(f"/api/v1/reservations/{taken.pk}/cancel/", {}, format="json").status_code == 200
    mine = client_for(alice).get(URL, {"open": "true"}).json()["results"]
    assert [(e["id"], e["status"]) for e in mine] == [(entry["id"], "offered")]
    assert mine[0]["offer"]["gpus"] == [gpus[0].pk] and mine[0]["claim_by"]

    # Someone else's entry does not exist for them; the owner claims it.
    assert client_for(bob).post(f"{URL}{entry['id']}/claim/").status_code == 404
    with django_capture_on_commit_callbacks(execute=True):
        claimed = client_for(alice).post(f"{URL}{entry['id']}/claim/")
    assert claimed.status_code == 200 and claimed.json()["status"] == "booked"
    assert Reservation.objects.get(pk=claimed.json()["reservation"]).status == Reservation.Status.APPROVED


def test_admins_see_everyones_entries_researchers_only_their_own(alice, bob, carol, gpus):
    book(carol, gpus, at(1), at(3))
    for user in (alice, bob):
        assert client_for(user).post(URL, join_body([gpus[0]]), format="json").status_code == 201
    assert [e["user"] for e in client_for(alice).get(URL).json()["results"]] == ["alice"]
    assert client_for(alice).get(URL, {"all": "true"}).json()["count"] == 1
    assert sorted(e["user"] for e in client_for(carol).get(URL, {"all": "true"}).json()["results"]) == ["alice", "bob"]


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        (
            {
                "earliest_start": "2030-01-07T10:00",
                "latest_end": "2030-01-07T12:00",
                "duration_minutes": 60,
                "gpus": [1],
            },
            400,
            "offset",
        ),
        ({"node": "nowhere", "count": 1, "earliest_start": "X", "latest_end": "X", "duration_minutes": 60}, 400, ""),
        ({"duration_minutes": 60}, 400, ""),
    ],
)
def test_bad_joins_are_400s_and_write_nothing(alice, gpus, body, status, words):
    response = client_for(alice).post(URL, body, format="json")
    assert response.status_code == status
    assert words in str(response.json())
    assert not Entry.objects.exists()


def test_a_want_for_an_unknown_node_or_gpu_is_a_400_naming_it(alice, gpus):
    response = client_for(alice).post(URL, join_body([], node="nowhere", count=1) | {"gpus": None}, format="json")
    assert response.status_code == 400
    body = {"node": "nowhere", "count": 1, "earliest_start": iso(1), "latest_end": iso(3), "duration_minutes": 60}
    response = client_for(alice).post(URL, body, format="json")
    assert response.status_code == 400 and "No node named 'nowhere'" in response.json()["error"]["message"]
    response = client_for(alice).post(URL, join_body([]) | {"gpus": [999999]}, format="json")
    assert response.status_code == 400 and "999999" in response.json()["error"]["message"]


def test_leaving_answers_with_the_closed_entry_whatever_the_list_filter(alice, bob, gpus):
    book(bob, [gpus[0]], at(1), at(3))
    entry = client_for(alice).post(URL, join_body([gpus[0]]), format="json").json()
    left = client_for(alice).post(f"{URL}{entry['id']}/leave/?open=true")
    assert left.status_code == 200 and left.json()["status"] == "left"
    assert client_for(alice).get(URL, {"open": "true"}).json()["results"] == []
    assert client_for(alice).get(f"{URL}{entry['id']}/?open=true").json()["status"] == "left"
