"""MIG slices as bookable units (issue 18): one rule across levels, enforced by the service and, on
PostgreSQL, by the database; limits count a slice as its share of a card."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from nodes.models import AgentState, Gpu
from reservations.availability import earliest_windows
from reservations.exceptions import InvalidBooking, LimitExceeded, SlotConflict
from reservations.fleet import fleet_status
from reservations.models import Allocation, Limit
from reservations.services import reservation_create
from tests.api_helpers import client_for
from tests.conftest import at
from tests.factories import book, carve_mig


@pytest.fixture
def card(gpus) -> Gpu:
    return gpus[0]


@pytest.fixture
def slices(card) -> list[Gpu]:
    return carve_mig(card)


def test_a_slice_and_its_neighbours_are_booked_by_different_people_at_once(clock, alice, bob, carol, slices):
    first = book(alice, [slices[0]], at(1), at(3))
    second = book(bob, [slices[1]], at(1), at(3))
    third = book(carol, [slices[2]], at(2), at(4))
    assert [r.allocations.get().gpu for r in (first, second, third)] == slices


def test_booking_the_card_over_a_booked_slice_is_refused_naming_the_slice(clock, alice, bob, card, slices):
    book(alice, [slices[1]], at(1), at(3))
    with pytest.raises(SlotConflict) as refused:
        book(bob, [card], at(2), at(4))
    assert "slice 2g.20gb@4" in str(refused.value)
    assert "by alice" in str(refused.value)
    assert [c["gpu"] for c in refused.value.details["conflicts"]] == [slices[1].pk]
    assert not bob.reservations.exists()


def test_booking_a_slice_under_a_booked_card_is_refused(clock, alice, bob, card, slices):
    book(alice, [card], at(1), at(3))
    with pytest.raises(SlotConflict):
        book(bob, [slices[2]], at(2), at(3))
    book(bob, [slices[2]], at(3), at(4))  # after it: back to back is fine


def test_booking_a_card_in_mig_mode_books_every_slice_of_it(clock, alice, card, slices):
    reservation = book(alice, [card, slices[0]], at(1), at(2))  # the slice asked twice is booked once
    assert sorted(reservation.allocations.values_list("gpu", flat=True)) == sorted(s.pk for s in slices)
    assert set(reservation.allocations.values_list("card", flat=True)) == {card.pk}


def test_a_card_booked_whole_before_mig_was_on_still_holds_it_against_slices(clock, alice, bob, gpus):
    card = gpus[1]
    book(alice, [card], at(1), at(3))  # MIG off: booked as one GPU
    pieces = carve_mig(card)  # then MIG goes on and the layout is confirmed
    with pytest.raises(SlotConflict):
        book(bob, [pieces[0]], at(2), at(3))


def test_slices_wait_for_the_admin_and_for_mig_mode(clock, alice, gpus):
    unconfirmed = carve_mig(gpus[2], confirmed=False)
    with pytest.raises(InvalidBooking, match="cannot be booked right now"):
        book(alice, [unconfirmed[0]], at(1), at(2))
    with pytest.raises(InvalidBooking, match="cannot be booked right now"):
        book(alice, [gpus[2]], at(1), at(2))  # the card means its slices, and they wait
    confirmed = carve_mig(gpus[3])
    Gpu.objects.filter(pk=gpus[3].pk).update(mig_mode=False)  # MIG switched off on the node
    with pytest.raises(InvalidBooking, match="cannot be booked right now"):
        book(alice, [confirmed[0]], at(1), at(2))
    book(alice, [gpus[3]], at(1), at(2))  # the card is one GPU again


def test_a_card_in_mig_mode_with_no_known_slices_says_so(clock, alice, gpus):
    Gpu.objects.filter(pk=gpus[1].pk).update(mig_mode=True)
    with pytest.raises(InvalidBooking, match="in MIG mode and has no slices"):
        book(alice, [gpus[1]], at(1), at(2))


def test_limits_count_a_slice_as_its_share_of_a_card(clock, alice, gpus, slices):
    Limit.objects.create(scope=Limit.Scope.USER, user=alice, max_gpus_at_once=1, weekly_gpu_hours=Decimal(2))
    book(alice, [slices[0]], at(1), at(2))  # 3/7 GPU for an hour
    book(alice, [slices[1], slices[2]], at(1), at(2))  # + 4/7: one GPU at once, exactly
    with pytest.raises(LimitExceeded) as refused:
        book(alice, [gpus[1]], at(1), at(2))
    assert str(refused.value).startswith("GPUs at once: 1 held + 1 asked > 1 allowed")
    with pytest.raises(LimitExceeded) as refused:
        book(alice, [gpus[1]], at(3), at(5))  # 1 GPU-hour used + 2 asked > 2
    assert "weekly GPU-hours: 1 used + 2 asked > 2 allowed" in str(refused.value)


def test_a_fraction_of_a_gpu_is_named_in_words(clock, alice, gpus, slices):
    Limit.objects.create(scope=Limit.Scope.USER, user=alice, max_gpus_at_once=1)
    book(alice, [gpus[1]], at(1), at(2))
    with pytest.raises(LimitExceeded) as refused:
        book(alice, [slices[0]], at(1), at(2))
    assert str(refused.value).startswith("GPUs at once: 1 held + 0.43 asked > 1 allowed")
    assert refused.value.details["asked"] == 0.429


@pytest.mark.postgres_only
@pytest.mark.skipif(connection.vendor != "postgresql", reason="the exclusion constraint is PostgreSQL's")
def test_the_database_refuses_a_card_over_its_slice_written_around_the_service(clock, alice, card, slices):
    reservation = book(alice, [slices[0]], at(1), at(3))
    with pytest.raises(IntegrityError), transaction.atomic():
        Allocation.objects.create(reservation=reservation, gpu=card, start=at(2), end=at(4))
    neighbour = Allocation(reservation=reservation, gpu=slices[1], start=at(2), end=at(4))
    neighbour.save()  # another slice's memory slices: allowed
    assert neighbour.placement_start == 4


def test_reservation_create_takes_slice_ids_like_gpu_ids(clock, alice, slices):
    made = reservation_create(user=alice, gpus=[slices[2].pk], start=at(1), end=at(1) + timedelta(hours=1))
    assert made.allocations.get().gpu == slices[2]


def test_the_finder_and_the_api_find_free_slices_of_a_profile(clock, alice, bob, card, slices):
    book(bob, [slices[1]], at(1), at(3))
    windows = earliest_windows(gpu_count=1, duration=timedelta(hours=1), now=at(1), profile="2g.20gb")
    assert [(w.gpus, w.start) for w in windows] == [([slices[2]], at(1))]
    windows = earliest_windows(gpu_count=2, duration=timedelta(hours=1), now=at(1), profile="2g.20gb")
    assert [(w.gpus, w.start) for w in windows] == [([slices[1], slices[2]], at(3))]
    # The card is taken while any slice of it is: whole-card windows on it open when bob's slice ends.
    cards = earliest_windows(gpu_count=4, duration=timedelta(hours=1), now=at(1), node_name=card.node.name)
    assert [w.start for w in cards] == [at(3)]

    api = client_for(alice)
    body = {"node": card.node.name, "gpu_count": 1, "profile": "2g.20gb", "start": at(1), "end": at(2)}
    made = api.post("/api/v1/reservations/", body, format="json")
    assert made.status_code == 201, made.json()
    assert [g["id"] for g in made.json()["gpus"]] == [slices[2].pk]
    again = api.post("/api/v1/reservations/", body, format="json")
    assert again.status_code == 409
    assert (
        again.json()["error"]["message"] == "Only 0 of the 1 2g.20gb slices asked are free on gpu-a100 for that slot."
    )
    found = api.get("/api/v1/availability/", {"gpus": 1, "hours": 1, "profile": "3g.40gb"})
    assert [w["gpus"] for w in found.json()["results"]] == [[slices[0].pk]]
    listed = {g["id"]: g for g in api.get("/api/v1/gpus/", {"node": card.node.name}).json()["results"]}
    assert listed[slices[0].pk]["parent"] == card.pk and listed[slices[0].pk]["profile"] == "3g.40gb"
    assert listed[card.pk]["mig_mode"] is True and listed[card.pk]["parent"] is None


def test_the_status_cards_show_a_mig_cards_slices_and_their_holders(clock, alice, card, slices):
    book(alice, [slices[1]], at(0), at(2))
    clock.shift(timedelta(minutes=30))
    AgentState.objects.create(node=card.node, last_seen=timezone.now(), agent_version="0.1.0", backend="simulated")
    [node] = fleet_status()
    mig_card = next(gpu for gpu in node["gpus"] if gpu["id"] == card.pk)
    assert [(s["profile"], s["current"]["user"] if s["current"] else None) for s in mig_card["slices"]] == [
        ("3g.40gb", None),
        ("2g.20gb", "alice"),
        ("2g.20gb", None),
    ]
    assert mig_card["current"] is None and mig_card["state"] == "in_use"  # a slice of it is held
    assert all("slices" not in gpu for gpu in node["gpus"] if gpu["id"] != card.pk)
