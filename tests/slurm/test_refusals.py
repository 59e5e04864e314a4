"""What admins hear of reservations Slurm refuses (alerts "Booking refused by Slurm"), on a controller standing in
for Slurm (tests/slurm/test_gpu_reservations.py's NewerSlurm) that refuses what a test tells it to: one alert per
node and holder that follows their refused bookings, and resolves only once none is left."""

from __future__ import annotations

from dataclasses import replace

import pytest

from alerts.models import Alert
from reservations.services import reservation_cancel, reservation_create, reservation_extend, reservation_release
from slurm.models import SlurmReservation
from slurm.naming import reservation_name
from slurm.reconcile import reconcile
from slurm.scontrol import SlurmError, SlurmInUse
from slurm.scontrol import SlurmReservation as Held
from tests.conftest import at
from tests.slurm.test_gpu_reservations import NewerSlurm, imported

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("clock")]
OVERLAP = "Error creating the reservation: Requested reservation overlaps with another reservation"


class Refusing(NewerSlurm):
    def __init__(self) -> None:
        super().__init__((22, 5, 8))
        self.refused: set[str] = set()
        self.busy: set[str] = set()  # jobs use these: a delete is refused
        self.released: list[str] = []

    def create(self, reservation: Held) -> None:
        if reservation.name in self.refused:
            raise SlurmError(OVERLAP)
        super().create(reservation)

    def update(self, reservation: Held) -> None:
        if reservation.name in self.refused:
            raise SlurmError(OVERLAP)
        super().update(reservation)

    def delete(self, name: str) -> None:
        if name in self.busy:
            raise SlurmInUse("delete_reservation ReservationName=...: Requested reservation is in use")
        super().delete(name)

    def release_jobs(self, name: str) -> list[str]:
        self.released.append(name)
        return []


def open_alert() -> Alert:
    return Alert.objects.get(kind=Alert.Kind.SLURM_REFUSED, resolved_at=None)


def test_the_alert_follows_the_holders_refused_bookings_until_none_is_left(alice):
    slurm = Refusing()
    node = imported(slurm)
    gpus = list(node.gpus.all())
    first = reservation_create(user=alice, gpus=gpus, start=at(1), end=at(2))
    second = reservation_create(user=alice, gpus=gpus, start=at(3), end=at(4))
    slurm.refused |= {reservation_name(first.pk), reservation_name(second.pk)}
    reconcile(controller=slurm, capabilities=slurm.capabilities(), now=at(0))
    assert Alert.objects.filter(kind=Alert.Kind.SLURM_REFUSED).count() == 1  # one per node and holder

    alert = open_alert()
    named = first if alert.reservation_id == first.pk else second  # the latest refusal it names
    other = second if named == first else first
    slurm.refused.discard(reservation_name(named.pk))  # the operator moved their maintenance off that one
    reconcile(controller=slurm, capabilities=slurm.capabilities(), now=at(0))

    alert.refresh_from_db()
    assert alert.resolved_at is None and alert.reservation_id == other.pk  # still one refused: still alerted
    slurm.refused.clear()
    reconcile(controller=slurm, capabilities=slurm.capabilities(), now=at(0))
    alert.refresh_from_db()
    assert alert.resolved_at is not None


def test_a_refused_extension_then_a_cancel_resolves_the_alert(alice):
    slurm = Refusing()
    node = imported(slurm)
    booking = reservation_create(user=alice, gpus=list(node.gpus.all()), start=at(1), end=at(2))
    reconcile(controller=slurm, capabilities=slurm.capabilities(), now=at(0))  # made
    reservation_extend(reservation=booking, actor=alice, end=at(3))
    slurm.refused.add(reservation_name(booking.pk))
    reconcile(controller=slurm, capabilities=slurm.capabilities(), now=at(0))  # the longer end refused
    assert open_alert().reservation_id == booking.pk

    reservation_cancel(reservation=booking, actor=alice)
    done = reconcile(controller=slurm, capabilities=slurm.capabilities(), now=at(0))

    assert done.deleted == [reservation_name(booking.pk)]
    assert SlurmReservation.objects.get(reservation=booking).state == SlurmReservation.State.REMOVED
    assert not Alert.objects.filter(kind=Alert.Kind.SLURM_REFUSED, resolved_at=None).exists()


def test_a_reservation_jobs_still_use_is_ended_rather_than_left_for_the_next_booking(alice, clock):
    slurm = Refusing()
    node = imported(slurm)
    booking = reservation_create(user=alice, gpus=list(node.gpus.all()), start=at(0), end=at(2))
    reconcile(controller=slurm, capabilities=slurm.capabilities(), now=at(0))
    name = reservation_name(booking.pk)
    slurm.held[name] = replace(slurm.held[name], start=at(0))
    slurm.busy.add(name)  # a job runs in it

    clock.move_to(at(1))
    reservation_release(reservation=booking, actor=alice)  # done early, with a job still running
    done = reconcile(controller=slurm, capabilities=slurm.capabilities(), now=at(1))

    assert done.ended == [name] and slurm.released == [name]  # waiting jobs moved out first
    assert slurm.held[name].end == at(1)  # ended now: the next booking's reservation does not overlap it
    assert reconcile(controller=slurm, capabilities=slurm.capabilities(), now=at(1)).updated == []  # no churn
