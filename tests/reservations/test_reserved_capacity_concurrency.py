"""Non-members racing for the last unreserved GPUs of an "any N GPUs" window, on PostgreSQL, each thread on its
own connection (as tests/reservations/test_concurrency.py): never more than the node's GPUs minus N are given
to them. The control test takes the node's lock away and shows the race is real."""

from __future__ import annotations

import threading
from collections import Counter
from datetime import timedelta
from functools import partial

import pytest
from django.contrib.auth.models import Group
from django.db import connection
from django.utils import timezone

from reservations import reserved, services
from reservations.exceptions import ReservedConflict
from reservations.models import Allocation, ReservedCapacity
from reservations.timegrid import floor_to_grid
from tests.factories import UserFactory, node_with_gpus
from tests.race import at_once

pytestmark = [
    pytest.mark.postgres_only,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="needs PostgreSQL"),
]
GPUS, KEPT = 8, 5  # three GPUs left to non-members


@pytest.fixture
def lab():
    node = node_with_gpus(GPUS, name="gpu-race")
    start = floor_to_grid(timezone.now()) + timedelta(days=1)
    window = ReservedCapacity.objects.create(
        group=Group.objects.create(name="vision"), node=node, count=KEPT, start=start, end=start + timedelta(hours=4)
    )
    racers = [UserFactory(username=f"racer{i}") for i in range(GPUS)]
    return node, list(node.gpus.order_by("index")), window, racers


def _race(racers, gpus, start) -> Counter:
    """Racer i books GPU i (all different GPUs: only the reserved capacity can refuse) at the same instant."""

    def attempt(i: int, user) -> str:
        begin = start + timedelta(minutes=15 * (i % 4))
        services.reservation_create(user=user, gpus=[gpus[i]], start=begin, end=begin + timedelta(hours=2))
        return "booked"

    return at_once(
        [partial(attempt, i, user) for i, user in enumerate(racers)], refusals={ReservedConflict: "reserved"}
    )


def test_non_members_racing_never_get_more_than_the_unreserved_gpus(lab):
    node, gpus, window, racers = lab

    outcomes = _race(racers, gpus, window.start)

    assert outcomes == Counter({"booked": GPUS - KEPT, "reserved": KEPT})
    assert Allocation.objects.filter(active=True, card__node=node).count() == GPUS - KEPT


def test_control_without_the_node_lock_the_race_is_real(lab, monkeypatch):
    """Without the window's lock, and every racer held after counting until all have counted, every one of
    them sees no other non-member's booking and books: the lock is what keeps the count."""
    node, gpus, window, racers = lab
    counted = threading.Barrier(GPUS, timeout=30)
    real_peak = reserved.others_peak

    def peak_then_wait(**kwargs):
        peak = real_peak(**kwargs)
        counted.wait()
        return peak

    monkeypatch.setattr(reserved, "lock_windows", lambda windows: None)
    monkeypatch.setattr(reserved, "others_peak", peak_then_wait)

    outcomes = _race(racers, gpus, window.start)

    assert outcomes == Counter({"booked": GPUS})
    assert Allocation.objects.filter(active=True, card__node=node).count() == GPUS  # KEPT more than allowed
