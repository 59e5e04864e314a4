"""A booking that cannot get its locks in time, or that PostgreSQL picks as a deadlock's victim, is a 503
"busy, try again" (BookingBusy) that wrote nothing, not a 500."""

from __future__ import annotations

import threading
from contextlib import contextmanager
from datetime import timedelta

import pytest
from django.db import connection, transaction

from accounts.models import User
from nodes.models import Gpu
from reservations import services
from reservations.exceptions import BookingBusy
from reservations.models import Reservation
from reservations.services import reservation_create, reservation_extend
from tests.conftest import at

pytestmark = [
    pytest.mark.postgres_only,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="needs PostgreSQL"),
]


@contextmanager
def gpu_held(gpu):
    """Another connection holds ``gpu``'s row lock (as a long booking transaction would) while the block runs."""
    with row_held(Gpu, gpu.pk):
        yield


@contextmanager
def row_held(model, pk, *, no_key=False):
    """Another connection holds the row lock of ``model`` ``pk`` while the block runs; ``no_key``: the weaker
    lock an UPDATE leaving the key alone takes (a deactivation), which lets foreign-key checks through."""
    locked, done = threading.Event(), threading.Event()

    def hold() -> None:
        try:
            with transaction.atomic():
                model.objects.select_for_update(no_key=no_key).get(pk=pk)
                locked.set()
                done.wait(timeout=30)
        finally:
            connection.close()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert locked.wait(timeout=30)
        yield
    finally:
        done.set()
        holder.join()


def test_a_booking_that_waits_too_long_for_its_gpu_is_busy_and_writes_nothing(alice, gpus, clock, settings):
    settings.BOOKING_LOCK_TIMEOUT_MS = 200
    with gpu_held(gpus[0]), pytest.raises(BookingBusy, match="try again in a moment") as busy:
        reservation_create(user=alice, gpus=[gpus[0]], start=at(1), end=at(2))
    assert busy.value.http_status == 503
    assert not Reservation.objects.exists()
    reservation_create(user=alice, gpus=[gpus[0]], start=at(1), end=at(2))  # once let go, it books


def test_a_deadlock_victim_is_busy_not_an_error(db):
    with pytest.raises(BookingBusy), services._booking_transaction(), connection.cursor() as cursor:
        # What PostgreSQL raises in the transaction it chooses to end when two wait for each other.
        cursor.execute("DO $$ BEGIN RAISE EXCEPTION 'deadlock detected' USING ERRCODE = '40P01'; END $$")


def test_an_auto_booking_offer_that_meets_busy_locks_stays_offered_for_the_next_try(alice, bob, gpus, clock, settings):
    from waitlist.models import Entry
    from waitlist.services import Want, entry_join, offer_settle

    settings.BOOKING_LOCK_TIMEOUT_MS = 200
    taken = reservation_create(user=bob, gpus=[gpus[0]], start=at(1), end=at(3))
    # Held for a claim (mailed once committed), then an auto-booking whose settling is run by hand, as the sweep
    # settles one whose after-commit step was lost.
    want = Want(gpus=[gpus[0]], earliest_start=at(1), latest_end=at(3), duration=timedelta(hours=2), auto_book=False)
    entry = entry_join(user=alice, want=want)
    services.reservation_cancel(reservation=taken, actor=bob)
    Entry.objects.filter(pk=entry.pk).update(auto_book=True)
    entry.refresh_from_db()
    offer = entry.reservation
    assert (entry.status, offer.status) == (Entry.Status.OFFERED, Reservation.Status.OFFERED)

    with gpu_held(gpus[0]), pytest.raises(BookingBusy):
        offer_settle(entry.pk)
    entry.refresh_from_db()
    offer.refresh_from_db()
    assert (entry.status, offer.status) == (Entry.Status.OFFERED, Reservation.Status.OFFERED)  # not passed on

    assert offer_settle(entry.pk).status == Entry.Status.BOOKED  # the sweep's next try books it


@pytest.mark.parametrize("held", ["the booker", "the card"])
def test_an_extension_waits_for_the_bookers_and_the_cards_locks(held, alice, gpus, clock, settings):
    """reservations/booking_sql.py's two locks, as an extension takes them (the user, then the cards, no load)."""
    booking = reservation_create(user=alice, gpus=[gpus[0]], start=at(1), end=at(2))
    settings.BOOKING_LOCK_TIMEOUT_MS = 200
    holding = row_held(User, alice.pk, no_key=True) if held == "the booker" else row_held(Gpu, gpus[0].pk)
    with holding, pytest.raises(BookingBusy):
        reservation_extend(reservation=booking, actor=alice, end=at(3))
    assert Reservation.objects.get(pk=booking.pk).end == at(2)
    assert reservation_extend(reservation=booking, actor=alice, end=at(3)).end == at(3)  # once let go
