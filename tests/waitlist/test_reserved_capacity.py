"""The waitlist and reserved capacity: a non-member waits past capacity kept for a group, and is offered it
the moment it is released; members are offered it from the start."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import Group

from reservations.models import ReservedCapacity
from reservations.tasks import release_reserved_capacity
from tests.conftest import at
from tests.factories import book
from waitlist.models import Entry
from waitlist.services import Want, entry_join

pytestmark = pytest.mark.usefixtures("clock")


@pytest.fixture
def vision(alice):
    group = Group.objects.create(name="vision")
    alice.groups.add(group)
    return group


def reserve(group, node, *, gpus=(), count=None, **fields):
    reserved = ReservedCapacity.objects.create(group=group, node=node, count=count, start=at(5), end=at(8), **fields)
    reserved.gpus.set(gpus)
    return reserved


def wait(user, **fields):
    return entry_join(
        user=user,
        want=Want(earliest_start=at(5), latest_end=at(8), duration=timedelta(hours=3), **fields),
    )


def test_a_reserved_gpu_is_offered_to_a_non_member_once_released(
    alice, bob, vision, node, gpus, clock, django_capture_on_commit_callbacks
):
    reserve(vision, node, gpus=[gpus[0]], release_hours_before=2)
    with django_capture_on_commit_callbacks(execute=True):
        waiting = wait(bob, gpus=[gpus[0]])
    assert waiting.status == Entry.Status.WAITING  # free, but kept for vision

    clock.move_to(at(3) + timedelta(minutes=1))  # two hours before the window: released
    with django_capture_on_commit_callbacks(execute=True):
        assert release_reserved_capacity() == 1
    waiting.refresh_from_db()
    assert waiting.status == Entry.Status.BOOKED
    assert (waiting.reservation.start, waiting.reservation.end) == (at(5), at(8))


def test_any_n_reserved_leaves_a_non_member_only_the_rest_and_a_member_gets_it_at_once(
    alice, bob, carol, vision, node, gpus, django_capture_on_commit_callbacks
):
    reserve(vision, node, count=3)  # of 4 GPUs
    book(carol, [gpus[3]], at(5), at(8))  # an admin's booking: the one GPU left for non-members is taken
    with django_capture_on_commit_callbacks(execute=True):
        waiting = wait(bob, node=node, count=1)
        member = wait(alice, node=node, count=2)
    waiting.refresh_from_db()
    member.refresh_from_db()
    assert waiting.status == Entry.Status.WAITING
    assert member.status == Entry.Status.BOOKED
