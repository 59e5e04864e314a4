"""A series and single bookings racing for its slots on PostgreSQL, each on its own connection: the series'
transaction locks the user and then the GPUs, so every slot ends up with exactly one holder."""

from __future__ import annotations

import itertools
import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from reservations import services
from reservations.exceptions import SlotConflict
from reservations.models import Allocation, Reservation
from reservations.series import SeriesRefused, series_create
from reservations.timegrid import floor_to_grid
from tests.factories import UserFactory

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
    outcomes: list[str] = []
    lock = threading.Lock()
    for round_number in range(ROUNDS):
        first = base + timedelta(days=7 * round_number, hours=round_number)
        barrier = threading.Barrier(1 + len(racers))

        def book_series(first=first, barrier=barrier) -> None:
            try:
                barrier.wait()
                series_create(
                    user=owner,
                    gpus=[gpus[0]],
                    start=first,
                    end=first + timedelta(hours=2),
                    rule="FREQ=DAILY;COUNT=5",
                    zone="UTC",
                    mode="skip",
                )
                result = "series"
            except SeriesRefused:
                result = "series refused"
            except Exception as exc:
                result = f"error: {exc!r}"
            finally:
                connection.close()
            with lock:
                outcomes.append(result)

        def book_one(i: int, user, first=first, barrier=barrier) -> None:
            try:
                barrier.wait()
                start = first + timedelta(days=i, minutes=30)  # inside occurrence i of the series
                services.reservation_create(user=user, gpus=[gpus[0]], start=start, end=start + timedelta(hours=1))
                result = "single"
            except SlotConflict:
                result = "conflict"
            except Exception as exc:
                result = f"error: {exc!r}"
            finally:
                connection.close()
            with lock:
                outcomes.append(result)

        threads = [threading.Thread(target=book_series)]
        threads += [threading.Thread(target=book_one, args=(i, user)) for i, user in enumerate(racers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)

    assert not [o for o in outcomes if o.startswith("error")], outcomes
    rows = list(Allocation.objects.filter(gpu=gpus[0], active=True).order_by("start").values_list("start", "end"))
    assert all(prev_end <= start for (_, prev_end), (start, _) in itertools.pairwise(rows))
    # Every racing single booking either won its slot (and the series skipped that occurrence) or was refused.
    singles = Reservation.objects.filter(series__isnull=True, status=Reservation.Status.APPROVED).count()
    occurrences = Reservation.objects.filter(series__isnull=False, status=Reservation.Status.APPROVED).count()
    assert singles + occurrences == len(rows) and singles + occurrences <= ROUNDS * 5
    assert outcomes.count("single") == singles
