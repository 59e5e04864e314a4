"""A burst of cancellations against 32 waiters on PostgreSQL, each cancellation on its own connection.

Every freed GPU goes to exactly one entry, the best ones that fit (fair share, then arrival), nobody ends over
their limits, and nothing is left on offer.
"""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from functools import partial

import pytest
from django.db import connection
from django.utils import timezone

from reservations import services
from reservations.models import Allocation, Limit, Reservation
from reservations.timegrid import floor_to_grid
from tests.factories import UserFactory, book, node_with_gpus
from tests.race import at_once
from waitlist.models import Entry
from waitlist.services import Want, entry_join, waitlist_sweep

pytestmark = [
    pytest.mark.postgres_only,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="needs PostgreSQL"),
]
WAITERS, FREED = 32, 8


def _cancel_all_at_once(bookings, actor) -> Counter:
    def cancel(booking) -> str:
        services.reservation_cancel(reservation=booking, actor=actor)
        return "cancelled"

    return at_once([partial(cancel, booking) for booking in bookings], refusals={}, timeout=120)


def test_a_burst_of_cancellations_serves_the_best_fitting_waiters_once_each():
    node = node_with_gpus(FREED, name="gpu-h100")
    elsewhere = node_with_gpus(4, name="gpu-4090").gpus.order_by("index")
    base = floor_to_grid(timezone.now()) + timedelta(days=1)
    end = base + timedelta(hours=2)
    Limit.objects.create(scope=Limit.Scope.SITE, max_gpus_at_once=1)
    holder = UserFactory(username="holder", is_staff=True)  # an admin: books past the limits
    taken = [book(holder, [gpu], base, end) for gpu in node.gpus.order_by("index")]
    waiters = [UserFactory(username=f"waiter{i:02}") for i in range(WAITERS)]
    for i, waiter in enumerate(waiters[:4]):  # already hold a GPU then: one more breaks their limit
        book(waiter, [elsewhere[i]], base, end)
    for i, waiter in enumerate(waiters[4:8]):  # used GPUs days ago: a lower fair-share factor than those after them
        past = base - timedelta(days=3)
        book(waiter, [elsewhere[i]], past, past + timedelta(hours=6), direct=True)
    want = Want(node=node, count=1, earliest_start=base, latest_end=end, duration=timedelta(hours=2))
    entries = [entry_join(user=waiter, want=want) for waiter in waiters]  # in arrival order
    assert {entry.status for entry in entries} == {Entry.Status.WAITING}

    outcomes = _cancel_all_at_once(taken, holder)
    waitlist_sweep()  # settles whatever a lost after-commit step left

    assert outcomes == Counter({"cancelled": FREED})
    by_user = {entry.user.username: entry for entry in Entry.objects.select_related("user", "reservation")}
    served = sorted(name for name, entry in by_user.items() if entry.status == Entry.Status.BOOKED)
    assert served == [f"waiter{i:02}" for i in range(8, 8 + FREED)]  # the best that fit, in arrival order
    for name in (f"waiter{i:02}" for i in range(4)):
        assert by_user[name].status == Entry.Status.WAITING and "GPUs at once" in by_user[name].skip_reason
    # One GPU each, every GPU once, nothing left held on offer.
    held = list(
        Allocation.objects.filter(active=True, gpu__node=node).values_list("reservation__user__username", "gpu")
    )
    assert sorted(user for user, _ in held) == served
    assert len({gpu for _, gpu in held}) == FREED
    assert not Reservation.objects.filter(status=Reservation.Status.OFFERED).exists()
    for waiter in waiters:
        live = Allocation.objects.filter(
            active=True,
            reservation__user=waiter,
            reservation__status=Reservation.Status.APPROVED,
            start__lt=end,
            end__gt=base,
        )
        assert live.count() <= 1, waiter.username
