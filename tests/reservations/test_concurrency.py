"""Truly simultaneous bookings on PostgreSQL, each thread on its own connection (pretix style).

The main test shows the service lets exactly one of 32 overlapping attempts through. The control
tests take the service's lock away and show that the race is real (every attempt passes the
check) and that the exclusion constraint still refuses all but one.
"""

from __future__ import annotations

import itertools
import threading
from collections import Counter
from datetime import timedelta
from functools import partial

import pytest
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from nodes.models import Gpu
from reservations import services
from reservations.exceptions import SlotConflict
from reservations.models import Allocation, Reservation
from reservations.timegrid import floor_to_grid
from tests.factories import UserFactory, carve_mig
from tests.race import at_once

pytestmark = [
    pytest.mark.postgres_only,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="needs PostgreSQL"),
]
ATTEMPTS = 32


def _race(users, gpu, base) -> Counter:
    """Each user tries to book an overlapping period of ``gpu`` at the same instant (``gpu`` may also be
    a function of the attempt's number, giving the unit it books)."""

    def attempt(i: int, user) -> str:
        # Staggered but overlapping: every pair of periods overlaps.
        start = base + timedelta(minutes=15 * (i % 4))
        unit = gpu(i) if callable(gpu) else gpu
        services.reservation_create(user=user, gpus=[unit], start=start, end=start + timedelta(hours=2))
        return "booked"

    return at_once([partial(attempt, i, user) for i, user in enumerate(users)], refusals={SlotConflict: "conflict"})


def _no_overlap_in_table(gpu) -> bool:
    rows = list(Allocation.objects.filter(gpu=gpu, active=True).order_by("start").values_list("start", "end"))
    return all(prev_end <= start for (_, prev_end), (start, _) in itertools.pairwise(rows))


@pytest.fixture
def racers(node):
    return [UserFactory(username=f"racer{i}") for i in range(ATTEMPTS)]


@pytest.fixture
def base():
    return floor_to_grid(timezone.now()) + timedelta(days=1)


def test_exactly_one_of_32_simultaneous_bookings_wins(racers, gpus, base):
    outcomes = _race(racers, gpus[0], base)

    assert outcomes == Counter({"booked": 1, "conflict": ATTEMPTS - 1})
    assert Reservation.objects.count() == 1
    assert _no_overlap_in_table(gpus[0])


def test_control_without_the_lock_the_race_is_real_and_the_constraint_holds(racers, gpus, base, monkeypatch):
    """Turn the row locks off and hold every attempt after its check until all have checked:
    all 32 pass the check (the race is real), and the constraint still lets only one write."""
    passed_check = threading.Barrier(ATTEMPTS, timeout=30)
    real_check = services._check_slot_free

    def check_then_wait(**kwargs):
        any_reserved = real_check(**kwargs)
        passed_check.wait()
        return any_reserved

    def cards_unlocked(gpu_ids, *, load=False):
        return list(Gpu.objects.select_related("node").filter(pk__in=gpu_ids).order_by("pk")) if load else []

    monkeypatch.setattr(services, "_lock_user", lambda user_id: True)  # no lock; "the account is active"
    monkeypatch.setattr(services, "_lock_cards", cards_unlocked)
    monkeypatch.setattr(services, "_check_slot_free", check_then_wait)

    outcomes = _race(racers, gpus[0], base)

    assert outcomes == Counter({"booked": 1, "conflict": ATTEMPTS - 1})
    assert Reservation.objects.count() == 1
    assert _no_overlap_in_table(gpus[0])


def test_a_booking_the_constraint_refuses_names_the_one_that_won_and_leaves_nothing(alice, gpus, base, monkeypatch):
    """As for a racer whose check ran just before the winner committed: the constraint refuses the write, the
    booking's transaction rolls back (no savepoint of its own), and the refusal names the winner, looked up
    after the rollback."""
    winner = services.reservation_create(user=alice, gpus=[gpus[0]], start=base, end=base + timedelta(hours=2))
    late = UserFactory(username="late")
    monkeypatch.setattr(services, "_check_slot_free", lambda **kwargs: False)  # its check saw nothing yet

    with pytest.raises(SlotConflict) as refused:
        services.reservation_create(
            user=late, gpus=[gpus[0]], start=base + timedelta(hours=1), end=base + timedelta(hours=3)
        )

    assert f"by alice (reservation #{winner.pk})" in refused.value.message
    assert [c["reservation"] for c in refused.value.details["conflicts"]] == [winner.pk]
    assert list(Reservation.objects.values_list("pk", flat=True)) == [winner.pk]
    assert not Reservation.objects.filter(user=late).exists()


def test_the_constraint_refuses_an_overlap_written_around_the_service(alice, gpus, base):
    reservation = services.reservation_create(user=alice, gpus=[gpus[0]], start=base, end=base + timedelta(hours=2))

    with pytest.raises(IntegrityError) as refused, transaction.atomic():
        Allocation.objects.create(
            reservation=reservation, gpu=gpus[1], start=base, end=base + timedelta(hours=1)
        )  # a different GPU is fine...
        other = Reservation.objects.create(user=alice, node=reservation.node, start=base, end=base + timedelta(hours=1))
        Allocation.objects.create(
            reservation=other, gpu=gpus[0], start=base + timedelta(hours=1), end=base + timedelta(hours=3)
        )

    assert refused.value.__cause__.sqlstate == "23P01"
    # ...and an inactive (cancelled) row may overlap: only live bookings hold slots.
    other = Reservation.objects.create(
        user=alice, node=reservation.node, start=base, end=base + timedelta(hours=1), status="cancelled"
    )
    Allocation.objects.create(reservation=other, gpu=gpus[0], start=base, end=base + timedelta(hours=1), active=False)


def test_exactly_one_of_32_simultaneous_bookings_of_a_card_and_its_slice_wins(racers, gpus, base):
    """Half the racers book a MIG card whole, half one of its slices: every pair conflicts across levels."""
    card = gpus[1]
    pieces = carve_mig(card)
    outcomes = _race(racers, lambda i: card if i % 2 else pieces[0], base)

    assert outcomes == Counter({"booked": 1, "conflict": ATTEMPTS - 1})
    assert Reservation.objects.count() == 1
    booked = set(Reservation.objects.get().allocations.values_list("gpu", flat=True))
    assert booked in ({pieces[0].pk}, {piece.pk for piece in pieces})  # the slice, or the card as all its slices
