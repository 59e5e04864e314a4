"""The reservations API over real HTTP handling, with real tokens."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from reservations import selectors
from reservations.models import Limit, Reservation
from reservations.serializers import ReservationSerializer
from reservations.services import reservation_create
from tests.api_helpers import api, client_for  # noqa: F401 - fixture
from tests.conftest import at
from tests.factories import UserFactory, book, carve_mig, node_with_gpus

pytestmark = pytest.mark.usefixtures("clock")
URL = "/api/v1/reservations/"


def iso(hours: float) -> str:
    return at(hours).isoformat()


def test_booking_by_gpu_ids(alice, gpus):
    response = client_for(alice).post(
        URL, {"gpus": [gpus[0].pk, gpus[1].pk], "start": iso(1), "end": iso(3), "purpose": "train"}, format="json"
    )
    assert response.status_code == 201, response.json()
    body = response.json()
    assert (body["user"], body["node"], body["status"], body["purpose"]) == ("alice", "gpu-a100", "approved", "train")
    assert [g["index"] for g in body["gpus"]] == [0, 1]
    assert body["start"] == "2030-01-07T10:00:00Z"


@pytest.mark.parametrize("kind", ["cards", "pending", "mig card"])
def test_a_new_bookings_201_says_what_reading_it_back_says(alice, gpus, kind):
    """The 201 is built from the booking in hand (selectors.booking_as_made), not read again."""
    if kind == "pending":
        chosen = [node_with_gpus(1, name="gpu-approve", requires_approval=True).gpus.get()]
    elif kind == "mig card":
        carve_mig(gpus[2])
        chosen = [gpus[2]]  # booked as all its slices
    else:
        chosen = gpus[:2]
    client = client_for(alice)
    made = client.post(URL, {"gpus": [gpu.pk for gpu in chosen], "start": iso(1), "end": iso(3)}, format="json")
    assert made.status_code == 201, made.json()
    assert made.json() == client.get(f"{URL}{made.json()['id']}/").json()


def test_a_booking_as_made_is_ready_to_answer_with_one_query(alice, gpus, rf, django_assert_num_queries):
    reservation = reservation_create(user=alice, gpus=gpus[:2], start=at(1), end=at(3))
    request = rf.get(URL)
    request.user = alice
    with django_assert_num_queries(1):  # its allocations with their GPUs; reservation_list's read costs four
        made = selectors.booking_as_made(reservation)
    with django_assert_num_queries(0):
        answer = ReservationSerializer(made, context={"request": request}).data
    read_back = selectors.reservation_list(user=alice).get(pk=reservation.pk)
    assert answer == ReservationSerializer(read_back, context={"request": request}).data


def test_booking_by_node_and_count_picks_free_gpus(alice, bob, gpus):
    reservation_create(user=bob, gpus=gpus[:1], start=at(1), end=at(3))
    response = client_for(alice).post(
        URL, {"node": "gpu-a100", "gpu_count": 2, "start": iso(2), "end": iso(4)}, format="json"
    )
    assert response.status_code == 201, response.json()
    assert [g["index"] for g in response.json()["gpus"]] == [1, 2]


def test_asking_for_more_gpus_than_are_free_is_a_409(alice, bob, gpus):
    reservation_create(user=bob, gpus=gpus[:3], start=at(1), end=at(3))
    response = client_for(alice).post(
        URL, {"node": "gpu-a100", "gpu_count": 2, "start": iso(2), "end": iso(4)}, format="json"
    )
    assert response.status_code == 409
    assert response.json()["error"]["message"] == "Only 1 of the 2 GPUs asked are free on gpu-a100 for that slot."


def test_a_conflict_is_409_naming_the_slot(alice, bob, gpus):
    taken = reservation_create(user=bob, gpus=gpus[:1], start=at(1), end=at(3))
    response = client_for(alice).post(URL, {"gpus": [gpus[0].pk], "start": iso(2), "end": iso(4)}, format="json")
    assert response.status_code == 409
    error = response.json()["error"]
    assert error["code"] == "slot_conflict"
    assert "gpu-a100/GPU 0 is booked 2030-01-07 10:00–12:00 UTC by bob" in error["message"]
    assert error["details"]["conflicts"][0]["reservation"] == taken.pk


def test_a_limit_is_403_naming_the_numbers(alice, gpus):
    Limit.objects.create(scope="site", max_gpus_at_once=1)
    response = client_for(alice).post(
        URL, {"gpus": [gpus[0].pk, gpus[1].pk], "start": iso(1), "end": iso(2)}, format="json"
    )
    assert response.status_code == 403
    assert response.json()["error"]["message"] == "GPUs at once: 0 held + 2 asked > 1 allowed"


@pytest.mark.parametrize(
    ("payload", "field", "words"),
    [
        ({"gpus": [1], "start": "2030-01-07T10:00:00", "end": "2030-01-07T11:00:00+00:00"}, "start", "time zone"),
        ({"gpus": [1], "start": "tomorrow", "end": "2030-01-07T11:00:00Z"}, "start", "wrong format"),
        ({"gpus": "all", "start": "2030-01-07T10:00:00Z", "end": "2030-01-07T11:00:00Z"}, "gpus", "list"),
        (
            {"gpus": [1], "node": "x", "start": "2030-01-07T10:00:00Z", "end": "2030-01-07T11:00:00Z"},
            "non_field_errors",
            "either gpus",
        ),
        ({"start": "2030-01-07T10:00:00Z", "end": "2030-01-07T11:00:00Z"}, "non_field_errors", "either gpus"),
        ({"gpus": [1], "start": "2030-01-07T10:00:00Z"}, "end", "required"),
    ],
)
def test_bad_fields_are_a_400_listing_them(alice, gpus, payload, field, words):
    response = client_for(alice).post(URL, payload, format="json")
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid"
    assert field in error["details"]["fields"]
    assert words in error["message"]
    assert not Reservation.objects.exists()


def test_a_body_that_is_not_json_is_a_400(alice):
    response = client_for(alice).post(URL, "{not json", content_type="application/json")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "parse_error"


def test_researchers_see_others_bookings_only_as_busy_slots(alice, bob, carol, gpus):
    reservation_create(user=alice, gpus=gpus[:1], start=at(1), end=at(2), purpose="secret project")
    mine = reservation_create(user=bob, gpus=gpus[1:2], start=at(1), end=at(2), purpose="bob's")

    seen_by_bob = {r["user"]: r for r in client_for(bob).get(URL).json()["results"]}
    assert seen_by_bob["alice"]["purpose"] is None
    assert seen_by_bob["alice"]["is_own"] is False
    assert seen_by_bob["bob"]["purpose"] == "bob's"
    seen_by_carol = {r["user"]: r for r in client_for(carol).get(URL).json()["results"]}
    assert seen_by_carol["alice"]["purpose"] == "secret project"
    assert client_for(bob).get(f"{URL}?mine=true").json()["count"] == 1
    assert client_for(bob).get(f"{URL}{mine.pk}/").json()["purpose"] == "bob's"


def test_researchers_do_not_see_others_cancelled_bookings(alice, bob, gpus):
    from reservations.services import reservation_cancel

    reservation_cancel(reservation=reservation_create(user=alice, gpus=gpus[:1], start=at(1), end=at(2)), actor=alice)
    assert client_for(bob).get(URL).json()["count"] == 0
    assert client_for(alice).get(URL).json()["count"] == 1


ACTIONS = [
    ("cancel", {}),
    ("release", {}),
    ("extend", {"end": "2030-01-07T14:00:00Z"}),
    ("approve", {}),
    ("reject", {"reason": "no"}),
]


@pytest.mark.parametrize(("name", "body"), ACTIONS)
def test_authorization_matrix_for_actions(alice, bob, carol, gpus, node, name, body):
    """anonymous: 401; another researcher: 404; the owner: allowed except approve/reject (403);
    an admin: allowed. Extending is allowed to both, but these bookings wait for approval: 409."""
    node.requires_approval = True
    node.save()

    start = at(0) if name == "release" else at(1)  # release needs a running slot, cancel an upcoming one

    def fresh():
        return book(alice, gpus[:1], start, at(2))

    expected_owner = 403 if name in {"approve", "reject"} else 409 if name == "extend" else 200
    expected_admin = 409 if name == "extend" else 200
    for who, expected in [(None, 401), (bob, 404), (alice, expected_owner), (carol, expected_admin)]:
        reservation = fresh()
        response = client_for(who).post(f"{URL}{reservation.pk}/{name}/", body, format="json")
        assert response.status_code == expected, (who, response.json())
        if expected != 200:
            reservation.refresh_from_db()
            assert (reservation.status, reservation.end) == ("pending", at(2))
        Reservation.objects.filter(pk=reservation.pk).update(status="cancelled")
        reservation.allocations.update(active=False)


@pytest.mark.parametrize(
    ("method", "path", "anonymous", "researcher"),
    [
        ("get", "/api/v1/reservations/", 401, 200),
        ("post", "/api/v1/reservations/", 401, 400),
        ("get", "/api/v1/nodes/", 401, 200),
        ("get", "/api/v1/nodes/gpu-a100/", 401, 200),
        ("get", "/api/v1/gpus/", 401, 200),
        ("get", "/api/v1/me/", 401, 200),
        ("delete", "/api/v1/reservations/1/", 401, 405),
        ("post", "/api/v1/nodes/", 401, 405),
    ],
)
def test_authorization_matrix_for_endpoints(alice, node, method, path, anonymous, researcher):
    assert getattr(client_for(None), method)(path).status_code == anonymous
    assert getattr(client_for(alice), method)(path, {}, format="json").status_code == researcher


def test_the_reject_action_needs_a_reason(alice, carol, gpus, node):
    node.requires_approval = True
    node.save()
    reservation = reservation_create(user=alice, gpus=gpus[:1], start=at(1), end=at(2))
    response = client_for(carol).post(f"{URL}{reservation.pk}/reject/", {}, format="json")
    assert response.status_code == 400
    assert "reason" in response.json()["error"]["details"]["fields"]


def test_extend_refusal_is_a_409_and_changes_nothing(alice, bob, gpus):
    reservation = reservation_create(user=alice, gpus=gpus[:1], start=at(1), end=at(2))
    reservation_create(user=bob, gpus=gpus[:1], start=at(2), end=at(3))
    response = client_for(alice).post(f"{URL}{reservation.pk}/extend/", {"end": iso(3)}, format="json")
    assert response.status_code == 409
    reservation.refresh_from_db()
    assert reservation.end == at(2)


def test_extending_a_booking_that_waits_for_approval_is_a_409_that_says_what_to_do(alice, carol, gpus, node):
    """Issue 37: the admin approves the slot they saw, never one lengthened meanwhile."""
    node.requires_approval = True
    node.save()
    reservation = reservation_create(user=alice, gpus=gpus[:1], start=at(1), end=at(2))

    for who in (alice, carol):
        response = client_for(who).post(
            f"{URL}{reservation.pk}/extend/", {"end": at(1, days=1).isoformat()}, format="json"
        )
        assert response.status_code == 409
        error = response.json()["error"]
        assert error["code"] == "invalid_state"
        assert error["message"] == (
            f"Reservation #{reservation.pk} waits for an admin's approval and cannot be extended: the admin approves "
            "the slot they saw. Wait for the decision and extend it then, or cancel it and book the longer slot."
        )
    reservation.refresh_from_db()
    assert (reservation.status, reservation.end) == ("pending", at(2))
    assert not Reservation.objects.filter(extends=reservation).exists()

    assert client_for(carol).post(f"{URL}{reservation.pk}/approve/", {}, format="json").status_code == 200
    extended = client_for(alice).post(f"{URL}{reservation.pk}/extend/", {"end": iso(3)}, format="json")
    assert extended.status_code == 200  # once approved, the added time is a request of its own
    body = extended.json()
    assert (body["end"], body["pending_extension"]["end"]) == ("2030-01-07T11:00:00Z", "2030-01-07T12:00:00Z")


def test_listing_costs_the_same_queries_whatever_the_data(alice, gpus):
    client = client_for(alice)
    client.get(URL)  # warm up: token last-used write

    def queries_for_list() -> int:
        with CaptureQueriesContext(connection) as ctx:
            assert client.get(URL).status_code == 200
        return len(ctx.captured_queries)

    reservation_create(user=alice, gpus=gpus[:2], start=at(1), end=at(2))
    few = queries_for_list()
    for i in range(10):
        other = UserFactory(username=f"u{i}")
        reservation_create(user=other, gpus=gpus[i % 4 : i % 4 + 1], start=at(3 + i), end=at(4 + i))
    assert queries_for_list() == few


def test_gpu_list_costs_the_same_queries_whatever_the_data(alice, gpus):
    client = client_for(alice)
    client.get("/api/v1/gpus/")

    def queries() -> int:
        with CaptureQueriesContext(connection) as ctx:
            assert client.get("/api/v1/gpus/").status_code == 200
        return len(ctx.captured_queries)

    few = queries()
    for i in range(8):
        reservation_create(user=UserFactory(username=f"v{i}"), gpus=gpus[i % 4 : i % 4 + 1], start=at(i), end=at(i + 1))
    assert queries() == few


def test_unknown_api_urls_answer_json_404(alice):
    for path in ["/api/v1/reservations/abc/", "/api/v1/nodes/Bad%20Name/", "/api/v1/nope/", "/api/v1/gpus/1e5/"]:
        response = client_for(alice).get(path)
        assert response.status_code == 404, path
        assert response.json()["error"]["code"] == "not_found"


def test_huge_pagination_numbers_are_clamped_not_500(alice, node):
    response = client_for(alice).get(f"{URL}?limit=30120385693722963192315904&offset=99999999999999999999999")
    assert response.status_code == 200
    assert response.json()["results"] == []


def test_huge_gpu_ids_are_a_400(alice):
    response = client_for(alice).post(
        URL, {"gpus": [50391672648949071872], "start": iso(1), "end": iso(2)}, format="json"
    )
    assert response.status_code == 400
    assert "gpus" in response.json()["error"]["details"]["fields"]


def test_only_json_bodies_are_accepted(alice, gpus):
    response = client_for(alice).post(URL, {"gpus": gpus[0].pk, "start": iso(1), "end": iso(2)})  # multipart
    assert response.status_code == 415
    assert response.json()["error"]["code"] == "unsupported_media_type"


def test_throttling_is_per_token(alice, node, monkeypatch):
    from kernel.throttling import TokenRateThrottle

    monkeypatch.setattr(TokenRateThrottle, "rate", "2/minute", raising=False)
    first, second = client_for(alice), client_for(alice)
    assert [first.get("/api/v1/nodes/").status_code for _ in range(2)] == [200, 200]
    throttled = first.get("/api/v1/nodes/")
    assert throttled.status_code == 429
    assert throttled.json()["error"]["code"] == "throttled"
    assert second.get("/api/v1/nodes/").status_code == 200  # another token has its own budget


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("get", "/api/v1/tokens/"),
        ("post", "/api/v1/tokens/"),
        ("get", "/api/v1/availability/?gpus=1&hours=1"),
        ("get", "/api/v1/gpus/1/"),
        ("get", "/api/v1/reservations/1/"),
    ],
)
def test_every_endpoint_refuses_anonymous_callers(db, method, path):
    response = getattr(client_for(None), method)(path)
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "not_authenticated"


def test_retrieving_a_reservation_by_owner_other_researcher_and_admin(alice, bob, carol, gpus):
    from reservations.services import reservation_cancel

    live = reservation_create(user=alice, gpus=gpus[:1], start=at(1), end=at(2), purpose="p")
    cancelled = reservation_create(user=alice, gpus=gpus[1:2], start=at(1), end=at(2), purpose="q")
    reservation_cancel(reservation=cancelled, actor=alice)
    for who, live_purpose, cancelled_status in [(alice, "p", 200), (bob, None, 404), (carol, "p", 200)]:
        response = client_for(who).get(f"{URL}{live.pk}/")
        assert (response.status_code, response.json()["purpose"]) == (200, live_purpose)
        assert client_for(who).get(f"{URL}{cancelled.pk}/").status_code == cancelled_status
