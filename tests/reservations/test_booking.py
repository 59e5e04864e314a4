from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from audit.models import AuditEntry
from nodes.models import Node
from reservations.exceptions import InvalidBooking, MaintenanceConflict, NotAllowed, SlotConflict
from reservations.models import Allocation, MaintenanceWindow, Reservation
from reservations.services import reservation_cancel, reservation_create, reservation_reject
from tests.conftest import MONDAY_9, at
from tests.factories import UserFactory, book, node_with_gpus

pytestmark = pytest.mark.usefixtures("clock")


def test_it_books_free_gpus_with_one_allocation_per_gpu(alice, gpus):
    reservation = book(alice, gpus[:2], at(1), at(5), purpose="  training  ")

    assert reservation.status == Reservation.Status.APPROVED
    assert (reservation.start, reservation.end) == (at(1), at(5))
    assert reservation.purpose == "training"
    allocations = Allocation.objects.filter(reservation=reservation).order_by("gpu__index")
    assert [(a.gpu.index, a.start, a.end, a.active) for a in allocations] == [
        (0, at(1), at(5), True),
        (1, at(1), at(5), True),
    ]


def test_it_refuses_an_overlapping_booking_naming_the_slot_and_writes_nothing(alice, bob, gpus):
    first = book(alice, gpus[1:2], at(1), at(5))

    with pytest.raises(SlotConflict) as refused:
        book(bob, gpus[:2], at(4), at(6))

    assert "gpu-a100/GPU 1 is booked 2030-01-07 10:00–14:00 UTC by alice" in refused.value.message
    assert refused.value.details["conflicts"][0]["reservation"] == first.pk
    assert Reservation.objects.count() == 1
    assert Allocation.objects.count() == 1


def test_back_to_back_slots_on_one_gpu_are_fine(alice, bob, gpus):
    book(alice, gpus[:1], at(1), at(3))
    second = book(bob, gpus[:1], at(3), at(5))
    assert second.start == at(3)


def test_other_gpus_of_the_node_stay_free(alice, bob, gpus):
    book(alice, gpus[:1], at(1), at(3))
    assert book(bob, gpus[1:], at(1), at(3)).allocations.count() == 3


def test_a_pending_booking_holds_its_slot(alice, bob, gpus, node):
    node.requires_approval = True
    node.save()
    pending = book(alice, gpus[:1], at(1), at(3))
    assert pending.status == Reservation.Status.PENDING

    with pytest.raises(SlotConflict, match="pending"):
        book(bob, gpus[:1], at(2), at(4))


def test_cancelling_or_rejecting_frees_the_slot(alice, bob, carol, gpus, node):
    node.requires_approval = True
    node.save()
    reservation_cancel(reservation=book(alice, gpus[:1], at(1), at(3)), actor=alice)
    reservation_reject(reservation=book(alice, gpus[1:2], at(1), at(3)), actor=carol, reason="course week")

    assert book(bob, gpus[:2], at(1), at(3)).allocations.count() == 2
    assert Allocation.objects.filter(active=False).count() == 2  # the old rows stay on record


def test_it_snaps_the_start_down_and_the_end_up_to_the_grid(alice, gpus):
    reservation = reservation_create(
        user=alice, gpus=gpus[:1], start=at(1) + timedelta(minutes=7), end=at(2) + timedelta(minutes=1)
    )
    assert (reservation.start, reservation.end) == (at(1), at(2.25))


def test_a_start_in_the_current_grid_cell_starts_now(alice, gpus, clock):
    clock.move_to(MONDAY_9 + timedelta(minutes=5, seconds=30), tick=False)
    reservation = reservation_create(user=alice, gpus=gpus[:1], start=MONDAY_9, end=at(1))
    assert reservation.start == MONDAY_9 + timedelta(minutes=5, seconds=30)


@pytest.mark.parametrize(
    ("start", "end", "message"),
    [
        (at(-1), at(1), "The start (2030-01-07 08:00 UTC) is in the past."),
        (at(3), at(2), "The end (2030-01-07 11:00 UTC) must be after the start (2030-01-07 12:00 UTC)."),
        (at(3), at(3), "must be after the start"),
        (datetime(2030, 1, 8, 9), at(30), "The start has no time zone: give an offset"),
        ("tomorrow", at(3), "The start must be a date and time."),
    ],
)
def test_it_refuses_bad_times_with_a_clear_message(alice, gpus, start, end, message):
    with pytest.raises(InvalidBooking) as refused:
        reservation_create(user=alice, gpus=gpus[:1], start=start, end=end)
    assert message in refused.value.message
    assert not Reservation.objects.exists()


def test_it_refuses_gpus_on_two_nodes(alice, gpus):
    other = node_with_gpus(1, name="gpu-4090")
    with pytest.raises(InvalidBooking, match="must be on one node; these are on gpu-4090, gpu-a100"):
        book(alice, [gpus[0], other.gpus.get()], at(1), at(2))
    assert not Reservation.objects.exists()


@pytest.mark.parametrize(
    ("gpu_list", "message"),
    [
        ([], "Choose at least one GPU."),
        ([999_999], "No GPU with id 999999."),
        (["1; rm -rf /"], "is not a GPU id"),
        ("dup", "The same GPU is listed twice."),
    ],
)
def test_it_refuses_bad_gpu_lists(alice, gpus, gpu_list, message):
    gpu_list = [gpus[0], gpus[0]] if gpu_list == "dup" else gpu_list
    with pytest.raises(InvalidBooking, match=message):
        book(alice, gpu_list, at(1), at(2))
    assert not Reservation.objects.exists()


def test_it_refuses_an_unbookable_gpu(alice, gpus):
    gpus[2].bookable = False
    gpus[2].save()
    with pytest.raises(InvalidBooking, match="gpu-a100/GPU 2 cannot be booked right now"):
        book(alice, gpus[1:3], at(1), at(2))


@pytest.mark.parametrize(
    ("status", "words"), [(Node.Status.MAINTENANCE, "in maintenance"), (Node.Status.DISABLED, "disabled")]
)
def test_it_refuses_a_node_that_is_not_active(alice, gpus, node, status, words):
    node.status = status
    node.save()
    with pytest.raises(InvalidBooking, match=f"Node gpu-a100 is {words} and takes no bookings"):
        book(alice, gpus[:1], at(1), at(2))


def test_it_refuses_an_overlong_purpose(alice, gpus):
    with pytest.raises(InvalidBooking, match="The purpose is 501 characters long"):
        book(alice, gpus[:1], at(1), at(2), purpose="x" * 501)


def test_a_user_without_a_unix_username_cannot_book(gpus):
    nobody = UserFactory(username="dave", unix_username=None)
    with pytest.raises(InvalidBooking, match="dave has no unix username yet"):
        book(nobody, gpus[:1], at(1), at(2))


def test_a_researcher_cannot_book_for_someone_else_but_an_admin_can(alice, bob, carol, gpus):
    with pytest.raises(NotAllowed, match="Only admins can book for someone else"):
        book(alice, gpus[:1], at(1), at(2), actor=bob)
    reservation = book(alice, gpus[:1], at(1), at(2), actor=carol)
    assert reservation.user == alice
    assert reservation.created_by == carol


def test_a_whole_node_maintenance_window_refuses_bookings_inside_it(alice, gpus, node):
    MaintenanceWindow.objects.create(node=node, start=at(2), end=at(4), reason="driver upgrade")

    with pytest.raises(MaintenanceConflict) as refused:
        book(alice, gpus[3:], at(3), at(5))
    assert refused.value.message == "Maintenance: gpu-a100 2030-01-07 11:00–13:00 UTC (driver upgrade)."
    assert book(alice, gpus[3:], at(4), at(5)).start == at(4)


def test_a_gpu_maintenance_window_blocks_only_that_gpu(alice, gpus, node):
    MaintenanceWindow.objects.create(node=node, gpu=gpus[0], start=at(2), end=at(4))

    with pytest.raises(MaintenanceConflict, match="gpu-a100/GPU 0"):
        book(alice, gpus[:2], at(1), at(3))
    assert book(alice, gpus[1:2], at(1), at(3)).allocations.count() == 1


def test_every_change_is_audited_with_before_and_after(alice, carol, gpus, node):
    node.requires_approval = True
    node.save()
    reservation = book(alice, gpus[:1], at(1), at(2))
    reservation_reject(reservation=reservation, actor=carol, reason="GPU reserved for the course")

    create, reject = AuditEntry.objects.filter(target_id=str(reservation.pk)).order_by("id")
    assert (create.action, create.actor, create.before, create.after["status"]) == (
        "reservation.create",
        alice,
        None,
        "pending",
    )
    assert (reject.action, reject.actor, reject.reason) == (
        "reservation.reject",
        carol,
        "GPU reserved for the course",
    )
    assert (reject.before["status"], reject.after["status"]) == ("pending", "rejected")
