"""A booking that cannot get its locks in time, or that PostgreSQL picks as a deadlock's victim, is a 503
"busy, try again" (BookingBusy) that wrote nothing, not a 500."""

from __future__ import annotations

import threading

import pytest
from django.db import connection, transaction

from nodes.models import Gpu
from reservations import services
from reservations.exceptions import BookingBusy
from reservations.models import Reservation
from reservations.services import reservation_create
from tests.conftest import at

pytestmark = [
    pytest.mark.postgres_only,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="needs PostgreSQL"),
]


def test_a_booking_that_waits_too_long_for_its_gpu_is_busy_and_writes_nothing(alice, gpus, clock, settings):
    settings.BOOKING_LOCK_TIMEOUT_MS = 200
    locked, done = threading.Event(), threading.Event()

    def hold_the_gpu() -> None:
        try:
            with transaction.atomic():
                Gpu.objects.select_for_update().get(pk=gpus[0].pk)
                locked.set()
                done.wait(timeout=30)
        finally:
            connection.close()

    holder = threading.Thread(target=hold_the_gpu)
    holder.start()
    try:
        assert locked.wait(timeout=30)
        with pytest.raises(BookingBusy, match="try again in a moment") as busy:
            reservation_create(user=alice, gpus=[gpus[0]], start=at(1), end=at(2))
    finally:
        done.set()
        holder.join()
    assert busy.value.http_status == 503
    assert not Reservation.objects.exists()
    reservation_create(user=alice, gpus=[gpus[0]], start=at(1), end=at(2))  # once let go, it books


def test_a_deadlock_victim_is_busy_not_an_error(db):
    with pytest.raises(BookingBusy), services._booking_transaction(), connection.cursor() as cursor:
        # What PostgreSQL raises in the transaction it chooses to end when two wait for each other.
        cursor.execute("DO $$ BEGIN RAISE EXCEPTION 'deadlock detected' USING ERRCODE = '40P01'; END $$")
