"""The waitlist: freed capacity goes to the best waiting entry, held for it, booked or claimed, or passed on."""

from __future__ import annotations

from datetime import time, timedelta
from io import StringIO

import pytest
from django.core.management import call_command

from accounts.models import User
from accounts.services import user_deactivate
from fairshare.models import GroupShare
from nodes.models import Gpu
from nodes.services import gpu_drain, gpu_return_to_service
from notifications.models import Kind, Notification
from reservations.exceptions import InvalidBooking, MaintenanceConflict, NotAllowed, SlotConflict
from reservations.models import Limit, MaintenanceWindow, Reservation
from reservations.series import series_create, series_edit
from reservations.services import reservation_cancel, reservation_create, reservation_release
from tests.conftest import at
from tests.factories import UserFactory, book
from waitlist.models import Entry
from waitlist.services import (
    Want,
    entry_join,
    entry_leave,
    offer_claim,
    offer_decline,
    offer_settle,
    waitlist_sweep,
)

pytestmark = pytest.mark.usefixtures("clock")
Status = Reservation.Status


@pytest.fixture
def run_after_commit(django_capture_on_commit_callbacks):
    """Run what waits for the commit (the offer's settling, pushes) as the test's own transaction cannot
    commit: call it around the change."""

    def run():
        return django_capture_on_commit_callbacks(execute=True)

    return run


def want(gpus=(), *, hours=2, start=1, end=3, **fields):
    return Want(
        gpus=list(gpus), earliest_start=at(start), latest_end=at(end), duration=timedelta(hours=hours), **fields
    )


def booking_of(user):
    return Reservation.objects.filter(user=user).exclude(status=Status.CANCELLED).get()


def test_a_cancelled_slot_is_booked_at_once_for_the_entry_that_waits_for_it(alice, bob, gpus, run_after_commit):
    taken = book(bob, [gpus[0]], at(1), at(3))
    with pytest.raises(SlotConflict):
        reservation_create(user=alice, gpus=[gpus[0]], start=at(1), end=at(3))
    entry = entry_join(user=alice, want=want([gpus[0]]))
    assert entry.status == Entry.Status.WAITING

    with run_after_commit():
        reservation_cancel(reservation=taken, actor=bob)

    entry.refresh_from_db()
    booking = booking_of(alice)
    assert (entry.status, entry.reservation) == (Entry.Status.BOOKED, booking)
    assert (booking.status, booking.start, booking.end) == (Status.APPROVED, at(1), at(3))
    assert list(booking.allocations.values_list("gpu", flat=True)) == [gpus[0].pk]


def test_a_claim_offer_holds_the_slot_is_mailed_and_becomes_the_booking_when_claimed(
    alice, bob, carol, gpus, run_after_commit
):
    taken = book(bob, [gpus[0]], at(1), at(3))
    entry = entry_join(user=alice, want=want([gpus[0]], auto_book=False))
    with run_after_commit():
        reservation_cancel(reservation=taken, actor=bob)

    entry.refresh_from_db()
    offer = entry.reservation
    assert (entry.status, offer.status) == (Entry.Status.OFFERED, Status.OFFERED)
    assert entry.claim_by == at(0) + timedelta(minutes=15)
    assert Notification.objects.filter(kind=Kind.WAITLIST_OFFER, user=alice, reservation=offer).exists()
    # Held: nobody else takes it meanwhile, and the refusal says why.
    with pytest.raises(SlotConflict, match="offered from the waitlist"):
        reservation_create(user=bob, gpus=[gpus[0]], start=at(1), end=at(2))
    with pytest.raises(NotAllowed):
        offer_claim(entry=entry, actor=bob)

    with run_after_commit():
        offer_claim(entry=entry, actor=alice)

    entry.refresh_from_db()
    offer.refresh_from_db()
    assert (entry.status, offer.status) == (Entry.Status.BOOKED, Status.APPROVED)


def test_an_unclaimed_offer_lapses_and_passes_on_exactly_once(alice, bob, gpus, clock, run_after_commit):
    dave = UserFactory(username="dave")
    taken = book(bob, [gpus[0]], at(1), at(3))
    first = entry_join(user=alice, want=want([gpus[0]], auto_book=False))
    second = entry_join(user=dave, want=want([gpus[0]], auto_book=False), now=at(0) + timedelta(seconds=1))
    with run_after_commit():
        reservation_cancel(reservation=taken, actor=bob)
    first.refresh_from_db()
    assert first.status == Entry.Status.OFFERED

    clock.move_to(at(0) + timedelta(minutes=15), tick=False)
    with run_after_commit():
        sweep = waitlist_sweep()
        again = waitlist_sweep()

    assert (sweep.lapsed, again.lapsed) == ([first.pk], [])
    first.refresh_from_db()
    second.refresh_from_db()
    assert first.status == Entry.Status.LAPSED and first.reservation.status == Status.CANCELLED
    assert second.status == Entry.Status.OFFERED
    assert Reservation.objects.filter(status=Status.OFFERED).count() == 1


def test_declining_passes_it_on_and_ends_the_entry(alice, bob, gpus, run_after_commit):
    dave = UserFactory(username="dave")
    taken = book(bob, [gpus[0]], at(1), at(3))
    first = entry_join(user=alice, want=want([gpus[0]], auto_book=False))
    second = entry_join(user=dave, want=want([gpus[0]]), now=at(0) + timedelta(seconds=1))
    with run_after_commit():
        reservation_cancel(reservation=taken, actor=bob)
    first.refresh_from_db()
    with run_after_commit():
        offer_decline(entry=first, actor=alice)

    first.refresh_from_db()
    second.refresh_from_db()
    assert first.status == Entry.Status.DECLINED
    assert second.status == Entry.Status.BOOKED and second.reservation.user == dave


def test_an_entry_over_its_limits_is_passed_over_with_the_reason_and_keeps_waiting(alice, bob, gpus, run_after_commit):
    dave = UserFactory(username="dave")
    Limit.objects.create(scope=Limit.Scope.USER, user=alice, max_gpus_at_once=1)
    book(alice, [gpus[1]], at(1), at(3))  # alice holds one GPU over the slot already
    taken = book(bob, [gpus[0]], at(1), at(3))
    over = entry_join(user=alice, want=want([gpus[0]]))
    fits = entry_join(user=dave, want=want([gpus[0]]), now=at(0) + timedelta(seconds=1))
    with run_after_commit():
        reservation_cancel(reservation=taken, actor=bob)

    over.refresh_from_db()
    fits.refresh_from_db()
    assert over.status == Entry.Status.WAITING
    assert "GPUs at once: 1 held + 1 asked > 1 allowed" in over.skip_reason
    assert fits.status == Entry.Status.BOOKED


def test_any_n_on_a_node_takes_what_is_free_with_the_freed_gpu(alice, bob, gpus, run_after_commit):
    for gpu in gpus[1:3]:
        book(bob, [gpu], at(1), at(3))
    book(bob, [gpus[3]], at(1), at(3))
    taken = book(bob, [gpus[0]], at(1), at(3))
    entry = entry_join(user=alice, want=want(node=gpus[0].node, count=1, hours=1))
    assert entry.status == Entry.Status.WAITING  # everything on the node is taken

    with run_after_commit():
        reservation_cancel(reservation=taken, actor=bob)

    entry.refresh_from_db()
    assert entry.status == Entry.Status.BOOKED
    booking = entry.reservation
    assert list(booking.allocations.values_list("gpu", flat=True)) == [gpus[0].pk]
    assert (booking.start, booking.end) == (at(1), at(2))  # the earliest hour of the window


def test_joining_when_the_gpus_are_free_books_them_at_once(alice, gpus, run_after_commit):
    with run_after_commit():
        entry = entry_join(user=alice, want=want([gpus[2]], start=2, end=6, hours=1))
    entry.refresh_from_db()
    assert entry.status == Entry.Status.BOOKED
    assert (entry.reservation.start, entry.reservation.end) == (at(2), at(3))


def test_a_release_offers_the_rest_of_the_slot_from_now(alice, bob, gpus, clock, run_after_commit):
    running = book(bob, [gpus[0]], at(0.5), at(4))
    entry = entry_join(user=alice, want=want([gpus[0]], start=1, end=4, hours=1))
    clock.move_to(at(1.5), tick=False)
    with run_after_commit():
        reservation_release(reservation=running, actor=bob)
    entry.refresh_from_db()
    assert entry.status == Entry.Status.BOOKED
    assert (entry.reservation.start, entry.reservation.end) == (at(1.5), at(2.5))


def test_lifted_maintenance_is_offered(alice, gpus, run_after_commit):
    window = MaintenanceWindow.objects.create(node=gpus[0].node, start=at(1), end=at(5), reason="driver update")
    entry = entry_join(user=alice, want=want([gpus[0]], start=1, end=5))
    assert entry.status == Entry.Status.WAITING
    with run_after_commit():
        window.delete()
    entry.refresh_from_db()
    assert entry.status == Entry.Status.BOOKED


def test_leaving_while_offered_passes_the_slot_on(alice, bob, gpus, run_after_commit):
    dave = UserFactory(username="dave")
    taken = book(bob, [gpus[0]], at(1), at(3))
    first = entry_join(user=alice, want=want([gpus[0]], auto_book=False))
    second = entry_join(user=dave, want=want([gpus[0]], auto_book=False), now=at(0) + timedelta(seconds=1))
    with run_after_commit():
        reservation_cancel(reservation=taken, actor=bob)
    first.refresh_from_db()
    with pytest.raises(NotAllowed):
        entry_leave(entry=first, actor=dave)
    with run_after_commit():
        entry_leave(entry=first, actor=alice)
    second.refresh_from_db()
    assert second.status == Entry.Status.OFFERED


def test_entries_expire_when_their_window_has_passed(alice, bob, gpus, clock):
    book(bob, [gpus[0]], at(1), at(3))
    entry = entry_join(user=alice, want=want([gpus[0]], start=1, end=3))
    clock.move_to(at(1, 0) + timedelta(minutes=15), tick=False)
    assert waitlist_sweep().expired == [entry.pk]
    entry.refresh_from_db()
    assert entry.status == Entry.Status.EXPIRED


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"hours": 0}, "duration must be positive"),
        ({"start": 1, "end": 2, "hours": 2}, "shorter than the duration"),
        ({"start": -3, "end": -1, "hours": 1}, "ends in the past"),
        ({"start": 1, "end": 3, "hours": 2, "gpus": ()}, "Say which GPUs"),
    ],
)
def test_a_want_that_cannot_be_met_is_refused_in_words(alice, gpus, fields, words):
    fields.setdefault("gpus", [gpus[0]])
    with pytest.raises(InvalidBooking, match=words):
        entry_join(user=alice, want=want(**fields))
    assert not Entry.objects.exists()


def test_one_person_may_wait_for_so_many_things(alice, bob, gpus, settings):
    settings.WAITLIST_MAX_ENTRIES = 2
    book(bob, gpus, at(1), at(3))
    for gpu in gpus[:2]:
        entry_join(user=alice, want=want([gpu]))
    with pytest.raises(NotAllowed, match="at most 2"):
        entry_join(user=alice, want=want([gpus[2]]))


def test_the_demo_gives_groups_shares_and_a_waitlist_entry_once(db):
    call_command("demo_lab", stdout=StringIO())
    out = StringIO()
    call_command("demo_waitlist", stdout=out)
    call_command("demo_waitlist", stdout=StringIO())  # again: nothing more
    assert dict(GroupShare.objects.values_list("group__name", "shares")) == {"vision": 2, "nlp": 1}
    (entry,) = Entry.objects.filter(user__username="alice")
    assert entry.want_text == "any 3 GPUs on gpu-a100 for 2 h" and entry.is_open
    assert "alice waits for any 3 GPUs on gpu-a100 for 2 h" in out.getvalue()


def test_a_gpu_back_from_a_drain_goes_to_whoever_waits_for_it(alice, carol, gpus, run_after_commit):
    gpu_drain(gpu=gpus[0], reason="fan broken", actor=carol)
    entry = entry_join(user=alice, want=want([gpus[0]], start=1, end=5))
    assert entry.status == Entry.Status.WAITING  # not bookable while drained
    with run_after_commit():
        gpu_return_to_service(gpu=Gpu.objects.get(pk=gpus[0].pk), actor=carol)
    entry.refresh_from_db()
    assert entry.status == Entry.Status.BOOKED and entry.reservation.start == at(1)


def test_any_gpu_of_a_model_is_served_on_whichever_node_frees_one(alice, bob, gpus, run_after_commit):
    model = gpus[0].model
    for gpu in gpus:
        book(bob, [gpu], at(1), at(3))
    entry = entry_join(user=alice, want=want(gpu_model=model, count=1))
    assert (entry.status, entry.node) == (Entry.Status.WAITING, None)
    assert entry.want_text == f"any 1 GPU of model {model} for 2 h"
    with run_after_commit():
        reservation_cancel(reservation=booking_on(gpus[3]), actor=bob)
    entry.refresh_from_db()
    assert entry.status == Entry.Status.BOOKED
    assert list(entry.reservation.allocations.values_list("gpu", flat=True)) == [gpus[3].pk]


def test_any_gpu_of_a_model_free_already_is_booked_at_once(alice, gpus, run_after_commit):
    with run_after_commit():
        entry = entry_join(user=alice, want=want(gpu_model=gpus[0].model, count=2))
    entry.refresh_from_db()
    assert entry.status == Entry.Status.BOOKED and entry.reservation.allocations.count() == 2


def booking_on(gpu):
    return Reservation.objects.get(allocations__gpu=gpu, status=Status.APPROVED)


def test_a_series_edit_keeps_its_own_slots_and_offers_only_what_it_gave_up(alice, bob, gpus, run_after_commit):
    # Alice books 10:00-11:00 on two days; Bob waits for the first of them.
    series = series_create(
        user=alice, gpus=[gpus[0]], start=at(hours=1), end=at(hours=2), rule="FREQ=DAILY;COUNT=2", zone="UTC"
    ).series
    entry = entry_join(user=bob, want=want([gpus[0]], hours=1, start=1, end=2))

    # An edit that changes nothing cancels and books the same slots again: they stay Alice's.
    with run_after_commit():
        series_edit(series=series, actor=alice, mode="skip")
    entry.refresh_from_db()
    assert entry.status == Entry.Status.WAITING
    assert [r.user for r in Reservation.objects.filter(status=Status.APPROVED)] == [alice, alice]

    # Moving the series an hour later gives up 10:00-11:00 today: Bob gets it.
    with run_after_commit():
        series_edit(series=series, actor=alice, start_time=time(11), mode="skip")
    entry.refresh_from_db()
    assert entry.status == Entry.Status.BOOKED
    assert (entry.reservation.user, entry.reservation.start, entry.reservation.end) == (bob, at(1), at(2))


def unsettled_offer(user, gpus, taken_by, *, hours=2, start=1, end=3, auto_book=True):
    """An offer written (the booking freeing it committed) whose after-commit settling has not run yet."""
    taken = book(taken_by, [gpus[0]], at(start), at(start + hours))
    entry = entry_join(user=user, want=want([gpus[0]], hours=hours, start=start, end=end, auto_book=auto_book))
    reservation_cancel(reservation=taken, actor=taken_by)  # its on-commit settling never runs in the test
    entry.refresh_from_db()
    assert entry.status == Entry.Status.OFFERED
    return entry


def test_an_auto_booking_whose_slot_ended_before_settling_is_passed_on_by_the_sweep(alice, bob, gpus, clock):
    entry = unsettled_offer(alice, gpus, bob, hours=1, start=1, end=2)
    clock.move_to(at(2, 0) + timedelta(minutes=5), tick=False)

    sweep = waitlist_sweep()  # used to raise at every run: the offer could not be accepted any more

    entry.refresh_from_db()
    assert entry.status == Entry.Status.EXPIRED
    assert entry.reservation.status == Status.CANCELLED
    assert sweep.passed_on == [entry.pk] and waitlist_sweep().passed_on == []


def test_an_auto_booking_on_a_gpu_drained_since_waits_again_with_the_reason(alice, bob, gpus):
    entry = unsettled_offer(alice, gpus, bob)
    offer = entry.reservation
    gpu_drain(gpu=gpus[0], reason="fan failure")

    offer_settle(entry.pk)

    entry.refresh_from_db()
    offer.refresh_from_db()
    assert (entry.status, entry.reservation) == (Entry.Status.WAITING, None)
    assert "cannot be booked right now" in entry.skip_reason
    assert offer.status == Status.CANCELLED


def test_claiming_an_offer_under_maintenance_since_is_refused_and_keeps_it(alice, bob, carol, gpus):
    entry = unsettled_offer(alice, gpus, bob, auto_book=False)
    MaintenanceWindow.objects.create(node=gpus[0].node, start=at(1), end=at(4), reason="new PSU", created_by=carol)

    with pytest.raises(MaintenanceConflict, match="new PSU"):
        offer_claim(entry=entry, actor=alice)
    entry.refresh_from_db()
    assert (entry.status, entry.reservation.status) == (Entry.Status.OFFERED, Status.OFFERED)


def test_an_admin_claiming_for_someone_skips_the_approval_the_node_asks_for(alice, bob, carol, gpus, node):
    node.requires_approval = True
    node.save(update_fields=["requires_approval"])
    mine = unsettled_offer(alice, gpus, bob, auto_book=False)
    assert offer_claim(entry=mine, actor=alice).reservation.status == Status.PENDING

    theirs = unsettled_offer(bob, gpus, carol, start=4, end=6, auto_book=False)
    assert offer_claim(entry=theirs, actor=carol).reservation.status == Status.APPROVED


def test_a_deactivated_account_stops_waiting_and_its_offer_passes_on(alice, bob, carol, gpus, run_after_commit):
    dave = UserFactory(username="dave")
    entry = unsettled_offer(alice, gpus, bob, auto_book=False)
    behind = entry_join(user=dave, want=want([gpus[0]]), now=at(0) + timedelta(seconds=1))

    with run_after_commit():
        user_deactivate(user=alice, actor=carol, reason="left the lab")

    entry.refresh_from_db()
    behind.refresh_from_db()
    assert entry.status == Entry.Status.LEFT and entry.reservation.status == Status.CANCELLED
    assert behind.status == Entry.Status.BOOKED and behind.reservation.user == dave


def test_the_sweep_closes_what_a_deactivation_left_open_and_nothing_is_offered_to_it(
    alice, bob, gpus, run_after_commit
):
    taken = book(bob, [gpus[0]], at(1), at(3))
    entry = entry_join(user=alice, want=want([gpus[0]]))
    User.objects.filter(pk=alice.pk).update(is_active=False)  # a write that bypassed the deactivation's reaction

    with run_after_commit():
        reservation_cancel(reservation=taken, actor=bob)
    entry.refresh_from_db()
    assert entry.status == Entry.Status.WAITING and not Reservation.objects.filter(status=Status.OFFERED).exists()

    assert waitlist_sweep().passed_on == [entry.pk]
    entry.refresh_from_db()
    assert entry.status == Entry.Status.LEFT
