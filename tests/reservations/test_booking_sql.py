"""reservations/booking_sql.py: the booking's four reads written in SQL give the answers the ORM gives, on
PostgreSQL and on SQLite (the suite runs on both), MIG slices included."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from itertools import product

import pytest
from django.contrib.auth.models import Group
from django.db import connection, transaction
from django.db.transaction import TransactionManagementError
from django.utils import timezone

from nodes.models import Gpu, Node
from reservations import booking_sql, selectors
from reservations.models import Limit, MaintenanceWindow, ReservedCapacity
from reservations.services import reservation_cancel
from tests.conftest import at
from tests.factories import book, carve_mig


@pytest.fixture
def lab(clock, alice, bob, node, gpus):
    """A MIG card (gpus[0]) with a slice booked, a whole card booked, a cancelled booking (inactive
    allocations), and maintenance of the whole node, of one card, and of the MIG card (which stops its slices)."""
    slices = carve_mig(gpus[0])
    on_slice = book(alice, [slices[1]], at(1), at(3))
    on_card = book(bob, [gpus[1]], at(2), at(4))
    reservation_cancel(reservation=book(bob, [gpus[2]], at(1), at(5)), actor=bob)
    MaintenanceWindow.objects.create(node=node, start=at(10), end=at(11))
    MaintenanceWindow.objects.create(node=node, gpu=gpus[3], start=at(5), end=at(6))
    MaintenanceWindow.objects.create(node=node, gpu=gpus[0], start=at(7), end=at(8))
    return {"node": node, "gpus": gpus, "slices": slices, "bookings": [on_slice, on_card]}


def test_the_slot_check_answers_as_the_selectors_do(lab):
    node, gpus, slices = lab["node"], lab["gpus"], lab["slices"]
    unit_sets = [
        [gpus[0]],  # the MIG card whole: overlaps every slice of it
        [slices[0]],
        [slices[1]],
        [slices[2]],
        [slices[0], slices[2]],
        [gpus[1]],
        [gpus[2]],  # its only booking is cancelled
        [gpus[3]],
        [gpus[1], gpus[3]],
    ]
    windows = [(at(h), at(h + length)) for h in range(12) for length in (1, 2)]
    excluded = [None, *(booking.pk for booking in lab["bookings"])]
    seen = set()
    for units, (start, end), exclude in product(unit_sets, windows, excluded):
        state = booking_sql.slot_state(node=node, gpus=units, start=start, end=end, exclude_reservation_id=exclude)
        expected = (
            selectors.maintenance_overlapping(node=node, gpus=units, start=start, end=end).exists(),
            selectors.allocations_overlapping(
                gpus=units, start=start, end=end, exclude_reservation_id=exclude
            ).exists(),
            False,
        )
        assert tuple(state) == expected, (units, start, end, exclude)
        seen.add(expected)
    assert {(True, False, False), (False, True, False), (False, False, False)} <= seen  # the lab tests each answer


def test_the_slot_check_sees_reserved_capacity_anywhere(lab):
    node, gpus = lab["node"], lab["gpus"]
    free = {"node": node, "gpus": [gpus[3]], "start": at(20), "end": at(21)}
    assert not booking_sql.slot_state(**free).any_reserved_capacity
    ReservedCapacity.objects.create(
        group=Group.objects.create(name="vision"), gpu_model=gpus[3].model, count=1, start=at(40), end=at(41)
    )
    assert booking_sql.slot_state(**free) == (False, False, True)


def test_the_card_lock_reads_cards_and_nodes_as_the_orm_does(lab):
    gpus, slices = lab["gpus"], lab["slices"]
    Gpu.objects.filter(pk=gpus[1].pk).update(bookable=False, drained_at=timezone.now(), drain_reason="fan")
    Node.objects.filter(pk=lab["node"].pk).update(requires_approval=True, books_whole=False)

    with transaction.atomic():
        cards = booking_sql.lock_cards([gpus[1].pk, slices[2].pk, slices[0].pk], load=True)

    expected = list(Gpu.objects.select_related("node").filter(pk__in=[gpus[0].pk, gpus[1].pk]).order_by("pk"))
    assert [card.pk for card in cards] == [card.pk for card in expected]  # a slice locks its card, in id order
    for card, orm in zip(cards, expected, strict=True):
        for got, want in ((card, orm), (card.node, orm.node)):
            for field in type(want)._meta.concrete_fields:
                value = getattr(got, field.attname)
                assert value == getattr(want, field.attname), field.attname
                assert type(value) is type(getattr(want, field.attname)), field.attname  # bools are bools
    assert cards[1].drained_at == Gpu.objects.get(pk=gpus[1].pk).drained_at
    assert cards[0].node is cards[1].node  # one node read once


@pytest.mark.postgres_only
@pytest.mark.skipif(connection.vendor != "postgresql", reason="SQLite takes no row locks")
@pytest.mark.django_db(transaction=True)
def test_a_lock_outside_a_transaction_is_refused_as_the_orm_refuses_it(alice, gpus):
    """(A row lock taken in autocommit would be let go as soon as it is taken.) That the locks hold other
    bookings back: tests/reservations/test_busy.py."""
    for lock in (lambda: booking_sql.lock_user(alice.pk), lambda: booking_sql.lock_cards([gpus[0].pk])):
        with pytest.raises(TransactionManagementError, match="needs a transaction"):
            lock()


def test_naive_moments_are_refused(lab):
    naive = at(1).replace(tzinfo=None)
    with pytest.raises(ValueError, match="aware"):
        booking_sql.slot_state(node=lab["node"], gpus=[lab["gpus"][3]], start=naive, end=at(2))


def test_the_user_lock_says_whether_the_account_is_active(alice, bob):
    bob.is_active = False
    bob.save()
    with transaction.atomic():
        assert booking_sql.lock_user(alice.pk) is True
        assert booking_sql.lock_user(bob.pk) is False
        assert booking_sql.lock_user(10**9) is False  # gone: no row, not active


def test_limit_rows_are_the_sites_the_users_groups_and_their_own(alice, bob):
    mine, theirs = Group.objects.create(name="mine"), Group.objects.create(name="theirs")
    alice.groups.add(mine)
    site = Limit.objects.create(scope=Limit.Scope.SITE, max_days_ahead=30)
    group = Limit.objects.create(scope=Limit.Scope.GROUP, group=mine, weekly_gpu_hours=Decimal("12.5"))
    Limit.objects.create(scope=Limit.Scope.GROUP, group=theirs, max_gpus_at_once=9)
    own = Limit.objects.create(scope=Limit.Scope.USER, user=alice, max_gpus_at_once=2)
    Limit.objects.create(scope=Limit.Scope.USER, user=bob, max_gpus_at_once=1)

    rows = {row.pk: row for row in booking_sql.limit_rows(alice)}
    assert set(rows) == {site.pk, group.pk, own.pk}
    assert rows[group.pk].weekly_gpu_hours == Decimal("12.5")
    assert {row.pk for row in booking_sql.limit_rows(bob)} == {site.pk, bob.booking_limit.pk}


def test_a_slot_check_window_touching_a_booking_is_free(lab):
    """Half-open periods: a slot that ends where a booking starts, or starts where it ends, does not overlap."""
    node, slices = lab["node"], lab["slices"]
    for start, end in ((at(0), at(1)), (at(3), at(4))):
        assert not booking_sql.slot_state(node=node, gpus=[slices[1]], start=start, end=end).taken
    assert booking_sql.slot_state(node=node, gpus=[slices[1]], start=at(3) - timedelta(minutes=15), end=at(4)).taken
