"""A series and single bookings racing for its slots on PostgreSQL, each on its own connection: the series'
transaction locks the user and then the GPUs, so every slot ends up with exactly one holder."""

from __future__ import annotations

import itertools
from collections import Counter
from datetime import timedelta
from functools import partial

import pytest
from django.db import connection
from django.utils import timezone

from reservations import services
from reservations.exceptions import SlotConflict
from reservations.models import Allocation, Reservation
from reservations.series import SeriesRefused, series_create
from reservations.timegrid import floor_to_grid
from tests.factories import UserFactory
from tests.race import at_once

pytestmark = [
    pytest.mark.postgres_only,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="needs PostgreSQL"),
]
ROUNDS = 6


def test_a_series_and_racing_single_bookings_never_share_a_slot(gpus):
    owner = UserFactory(username="serial")
    racers = [UserFactory(username=f"racer{i}") for i in range(4)]
    base = floor_to_grid(timezone.now()) + timedelta(days=1)
    outcomes: Counter = Counter()
    for round_number in range(ROUNDS):
        first = base + timedelta(days=7 * round_number, hours=round_number)

        def book_series(first=first) -> str:
            rule = "FREQ=DAILY;COUNT=5"
            end = first + timedelta(hours=2)
            series_create(user=owner, gpus=[gpus[0]], start=first, end=end, rule=rule, zone="UTC", mode="skip")
            return "series"

        def book_one(i: int, user, first=first) -> str:
            start = first + timedelta(days=i, minutes=30)  # inside occurrence i of the series
            services.reservation_create(user=user, gpus=[gpus[0]], start=start, end=start + timedelta(hours=1))
            return "single"

        attempts = [book_series, *(partial(book_one, i, user) for i, user in enumerate(racers))]
        outcomes += at_once(attempts, refusals={SeriesRefused: "series refused", SlotConflict: "conflict"})

    assert not [o for o in outcomes if o.startswith("error")], outcomes
    rows = list(Allocation.objects.filter(gpu=gpus[0], active=True).order_by("start").values_list("start", "end"))
    assert all(prev_end <= start for (_, prev_end), (start, _) in itertools.pairwise(rows))
    # Every racing single booking either won its slot (and the series skipped that occurrence) or was refused.
    singles = Reservation.objects.filter(series__isnull=True, status=Reservation.Status.APPROVED).count()
    occurrences = Reservation.objects.filter(series__isnull=False, status=Reservation.Status.APPROVED).count()
    assert singles + occurrences == len(rows) and singles + occurrences <= ROUNDS * 5
    assert outcomes["single"] == singles
