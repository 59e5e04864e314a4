"""Approve, reject, cancel, release and extend: who may, when, and what changes."""

from __future__ import annotations

from datetime import timedelta

import pytest

from reservations.exceptions import InvalidBooking, InvalidState, NotAllowed, SlotConflict
from reservations.models import Reservation
from reservations.services import (
    reservation_approve,
    reservation_cancel,
    reservation_extend,
    reservation_reject,
    reservation_release,
)
from tests.conftest import MONDAY_9, at
from tests.factories import book

pytestmark = pytest.mark.usefixtures("clock")
Status = Reservation.Status


@pytest.fixture
def pending(alice, gpus, node):
    node.requires_approval = True
    node.save()
    return book(alice, gpus[:1], at(1), at(3))


def test_an_admin_approves_a_pending_booking(pending, carol):
    approved = reservation_approve(reservation=pending, actor=carol, reason="ok")
    pending.refresh_from_db()
    assert (pending.status, pending.decided_by, pending.decided_at) == (Status.APPROVED, carol, MONDAY_9)
    assert approved.decision_reason == "ok"


def test_a_researcher_cannot_approve_or_reject(pending, alice, bob):
    with pytest.raises(NotAllowed, match="Only admins can approve bookings"):
        reservation_approve(reservation=pending, actor=alice)
    with pytest.raises(NotAllowed, match="Only admins can reject bookings"):
        reservation_reject(reservation=pending, actor=bob, reason="mine")
    pending.refresh_from_db()
    assert pending.status == Status.PENDING


def test_only_pending_bookings_can_be_decided(pending, carol):
    reservation_approve(reservation=pending, actor=carol)
    with pytest.raises(InvalidState, match="is approved and cannot be approved"):
        reservation_approve(reservation=pending, actor=carol)
    with pytest.raises(InvalidState, match="is approved and cannot be rejected"):
        reservation_reject(reservation=pending, actor=carol, reason="changed my mind")


def test_a_rejection_needs_a_reason(pending, carol):
    with pytest.raises(InvalidBooking, match="Give a reason"):
        reservation_reject(reservation=pending, actor=carol, reason="   ")
    pending.refresh_from_db()
    assert pending.status == Status.PENDING


def test_a_booking_that_ended_while_pending_cannot_be_approved(pending, carol, clock):
    clock.shift(timedelta(hours=4))
    with pytest.raises(InvalidState, match="ended at 2030-01-07 12:00 UTC: nothing to approve"):
        reservation_approve(reservation=pending, actor=carol)


def test_the_owner_cancels_before_the_start(alice, gpus):
    reservation = reservation_cancel(
        reservation=book(alice, gpus[:1], at(1), at(3)), actor=alice, reason="plans changed"
    )
    assert (reservation.status, reservation.cancelled_by, reservation.cancel_reason) == (
        Status.CANCELLED,
        alice,
        "plans changed",
    )
    assert not reservation.allocations.filter(active=True).exists()


def test_the_owner_cannot_cancel_a_started_slot_but_is_told_to_release(alice, gpus, clock):
    reservation = book(alice, gpus[:1], at(1), at(3))
    clock.shift(timedelta(hours=1, minutes=30))
    with pytest.raises(InvalidState, match="started at 2030-01-07 10:00 UTC: release it") as refused:
        reservation_cancel(reservation=reservation, actor=alice)
    assert refused.value.details["hint"] == "release"


def test_an_admin_cancels_a_running_slot(alice, carol, gpus, clock):
    reservation = book(alice, gpus[:1], at(1), at(3))
    clock.shift(timedelta(hours=2))
    assert reservation_cancel(reservation=reservation, actor=carol).status == Status.CANCELLED


def test_someone_else_cannot_cancel_release_or_extend(alice, bob, gpus):
    reservation = book(alice, gpus[:1], at(0), at(3))
    for operation, kwargs in [
        (reservation_cancel, {}),
        (reservation_release, {}),
        (reservation_extend, {"end": at(4)}),
    ]:
        with pytest.raises(NotAllowed, match=f"Only the owner or an admin can \\w+ reservation #{reservation.pk}"):
            operation(reservation=reservation, actor=bob, **kwargs)
    reservation.refresh_from_db()
    assert (reservation.status, reservation.end) == (Status.APPROVED, at(3))


def test_cancelling_twice_is_refused(alice, gpus):
    reservation = book(alice, gpus[:1], at(1), at(3))
    reservation_cancel(reservation=reservation, actor=alice)
    with pytest.raises(InvalidState, match="is cancelled and cannot be cancelled"):
        reservation_cancel(reservation=reservation, actor=alice)


def test_release_ends_a_running_slot_now_and_frees_the_rest(alice, bob, gpus, clock):
    reservation = book(alice, gpus[:2], at(0), at(4))
    clock.shift(timedelta(hours=1, minutes=10))

    released = reservation_release(reservation=reservation, actor=alice)

    assert (released.end, released.released_at, released.status) == (
        at(1 + 10 / 60),
        at(1 + 10 / 60),
        Status.APPROVED,
    )
    assert set(released.allocations.values_list("end", flat=True)) == {at(1 + 10 / 60)}
    assert book(bob, gpus[:2], at(1.25), at(4)).allocations.count() == 2


def test_release_of_an_upcoming_slot_says_cancel_instead(alice, gpus):
    with pytest.raises(InvalidState, match="starts at 2030-01-07 11:00 UTC: cancel it instead"):
        reservation_release(reservation=book(alice, gpus[:1], at(2), at(3)), actor=alice)


def test_release_of_a_finished_slot_is_refused(alice, gpus, clock):
    reservation = book(alice, gpus[:1], at(0), at(1))
    clock.shift(timedelta(hours=2))
    with pytest.raises(InvalidState, match="already ended at 2030-01-07 10:00 UTC"):
        reservation_release(reservation=reservation, actor=alice)


def test_extend_moves_the_end_of_the_reservation_and_its_allocations(alice, gpus):
    reservation = reservation_extend(
        reservation=book(alice, gpus[:2], at(1), at(3)), actor=alice, end=at(4) + timedelta(minutes=1)
    )
    assert reservation.end == at(4.25)
    assert set(reservation.allocations.values_list("end", flat=True)) == {at(4.25)}


def test_extend_into_someone_elses_slot_is_refused_and_changes_nothing(alice, bob, gpus):
    reservation = book(alice, gpus[:2], at(1), at(3))
    book(bob, gpus[1:2], at(4), at(6))

    with pytest.raises(SlotConflict, match="gpu-a100/GPU 1 is booked 2030-01-07 13:00–15:00 UTC by bob"):
        reservation_extend(reservation=reservation, actor=alice, end=at(5))
    reservation.refresh_from_db()
    assert reservation.end == at(3)
    assert set(reservation.allocations.values_list("end", flat=True)) == {at(3)}


def test_extend_to_an_earlier_end_is_refused(alice, gpus):
    with pytest.raises(InvalidBooking, match="must be after the current end"):
        reservation_extend(reservation=book(alice, gpus[:1], at(1), at(3)), actor=alice, end=at(2))


def test_extend_into_maintenance_is_refused(alice, gpus, node):
    from reservations.models import MaintenanceWindow

    reservation = book(alice, gpus[:1], at(1), at(3))
    MaintenanceWindow.objects.create(node=node, start=at(4), end=at(5), reason="PSU swap")
    with pytest.raises(SlotConflict, match="Maintenance: gpu-a100 2030-01-07 13:00–14:00 UTC \\(PSU swap\\)"):
        reservation_extend(reservation=reservation, actor=alice, end=at(6))


def test_a_finished_reservation_cannot_be_extended(alice, gpus, clock):
    reservation = book(alice, gpus[:1], at(0), at(1))
    clock.shift(timedelta(hours=1))
    with pytest.raises(InvalidState, match="already ended"):
        reservation_extend(reservation=reservation, actor=alice, end=at(3))
