"""Booked GPUs left idle: the holder is told once (real SMTP); with IDLE_AUTO_RELEASE_MINUTES the
booking is released through reservation_release, audited with the reason, and the holder told. Both
mails go through the mail outbox (notifications/): ``outbox_drain`` sends them here, as the worker
nudged after the run's commit, or beat's drain, would."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from alerts.idle import alerts_check_idle
from alerts.models import Alert
from audit.models import AuditEntry
from nodes.models import GpuMinute
from notifications.models import Kind, Notification
from notifications.services import outbox_drain
from tests.conftest import at
from tests.factories import carve_mig
from tests.mailserver import text_of


def minutes(gpu, start, count, utilization):
    """Per-minute telemetry as nodes.usage folds it: 12 samples a minute at ``utilization`` %."""
    for i in range(count):
        GpuMinute.objects.update_or_create(
            gpu=gpu,
            minute=start + timedelta(minutes=i),
            defaults={"samples": 12, "utilization_samples": 12, "utilization_sum": 12 * utilization},
        )


@pytest.fixture
def booking(alice, gpus, clock, booked):
    """alice holds GPUs 0 and 1 from 10:00 to 13:00 (her confirmation sent and forgotten); the clock
    is at 10:40."""
    reservation = booked(alice, gpus[:2], at(1), at(4), purpose="training")
    clock.move_to(at(1, 0) + timedelta(minutes=40), tick=False)
    return reservation


def test_an_idle_booked_gpu_mails_its_holder_once(booking, gpus, smtp_server):
    minutes(gpus[0], at(1), 40, utilization=2)  # idle
    minutes(gpus[1], at(1), 40, utilization=60)  # busy
    run = alerts_check_idle(now=timezone.now())
    (alert,) = Alert.objects.filter(kind="idle")
    assert run.opened == [alert.pk] and run.holders_told == [booking.pk]
    assert (alert.gpu, alert.username, alert.reservation_id) == (gpus[0], "alice", booking.pk)
    assert alert.details["mean_utilization_pct"] == 2.0

    assert alerts_check_idle(now=timezone.now()).holders_told == []  # the next beat: nothing more
    assert outbox_drain() == {Kind.IDLE: 1}
    (mail,) = smtp_server.wait_for(1)
    assert mail["To"] == "alice@lab.example"
    assert mail["Subject"] == f"Your GPU on gpu-a100 is idle (booking #{booking.pk})"
    assert "GPU 0 until" in text_of(mail) and "under 5 % utilisation for the last 30 minutes" in text_of(mail)
    assert "releases the booking by itself" not in text_of(mail)  # the policy is off


def test_use_resolves_it_and_a_new_idle_spell_in_the_same_booking_does_not_mail_again(
    booking, gpus, smtp_server, clock
):
    minutes(gpus[0], at(1), 40, utilization=0)
    minutes(gpus[1], at(1), 40, utilization=90)
    alerts_check_idle(now=timezone.now())
    minutes(gpus[0], at(1) + timedelta(minutes=40), 1, utilization=50)
    clock.shift(timedelta(minutes=1))
    assert len(alerts_check_idle(now=timezone.now()).resolved) == 1
    assert Alert.objects.get(kind="idle").resolution == "the GPU is in use again"

    minutes(gpus[0], at(1) + timedelta(minutes=41), 40, utilization=1)
    minutes(gpus[1], at(1) + timedelta(minutes=41), 40, utilization=90)
    clock.shift(timedelta(minutes=40))
    run = alerts_check_idle(now=timezone.now())
    assert len(run.opened) == 1 and run.holders_told == []
    outbox_drain()
    assert len(smtp_server.wait_for(2, timeout=1)) == 1


def test_a_gpu_that_reported_too_little_is_not_called_idle(booking, gpus):
    minutes(gpus[0], at(1) + timedelta(minutes=20), 20, utilization=0)  # 20 of the last 30 minutes
    minutes(gpus[1], at(1), 5, utilization=0)
    assert alerts_check_idle(now=timezone.now()).opened == []


def test_a_slice_is_called_idle_from_its_utilisation_and_never_without_one(bob, gpus, clock, booked):
    """A slice on a card with GPM reports utilisation and is judged like a card; one on a card without GPM (an
    A100) reports none, and nobody can say it is idle."""
    slices = carve_mig(gpus[2])
    measured = booked(bob, [slices[0]], at(1), at(4))
    booked(bob, [slices[1]], at(1), at(4))
    clock.move_to(at(1, 0) + timedelta(minutes=40), tick=False)
    minutes(slices[0], at(1), 40, utilization=1)
    for i in range(40):  # readings every minute, none with a utilisation
        GpuMinute.objects.create(gpu=slices[1], minute=at(1) + timedelta(minutes=i), samples=12)

    run = alerts_check_idle(now=timezone.now())

    (alert,) = Alert.objects.filter(kind="idle")
    assert run.opened == [alert.pk]
    assert (alert.gpu, alert.reservation_id) == (slices[0], measured.pk)


def test_auto_release_releases_an_idle_booking_after_telling_its_holder(booking, gpus, smtp_server, settings, clock):
    settings.IDLE_AUTO_RELEASE_MINUTES = 15
    minutes(gpus[0], at(1), 60, utilization=1)
    minutes(gpus[1], at(1), 60, utilization=3)
    run = alerts_check_idle(now=timezone.now())
    assert run.holders_told == [booking.pk] and run.released == []
    outbox_drain()
    told = smtp_server.wait_for(1)[0]
    assert "Your GPUs on gpu-a100 are idle" in told["Subject"] and "releases the booking by itself" in text_of(told)

    clock.shift(timedelta(minutes=15))
    run = alerts_check_idle(now=timezone.now())
    assert run.released == [booking.pk]
    booking.refresh_from_db()
    assert booking.released_at == timezone.now() and booking.end == timezone.now()
    entry = AuditEntry.objects.get(action="reservation.idle_release")
    assert entry.actor is None and "IDLE_AUTO_RELEASE_MINUTES" in entry.reason
    assert AuditEntry.objects.filter(action="reservation.release", target_id=str(booking.pk)).exists()
    assert set(Alert.objects.filter(kind="idle").values_list("resolution", flat=True)) == {
        "booking released automatically"
    }
    assert outbox_drain() == {Kind.IDLE_RELEASED: 1}  # written with the release, in its transaction
    released = smtp_server.wait_for(2)[1]
    assert released["Subject"] == f"Your idle booking #{booking.pk} on gpu-a100 was released"
    assert "stayed under 5 % utilisation for 30 minutes, and still 15 minutes after" in text_of(released)

    assert alerts_check_idle(now=timezone.now()).released == []  # once
    assert outbox_drain() == {}
    assert len(smtp_server.wait_for(3, timeout=1)) == 2


def test_auto_release_spares_a_booking_with_one_gpu_in_use(booking, gpus, smtp_server, settings, clock):
    settings.IDLE_AUTO_RELEASE_MINUTES = 15
    minutes(gpus[0], at(1), 60, utilization=0)
    minutes(gpus[1], at(1), 60, utilization=70)
    alerts_check_idle(now=timezone.now())
    clock.shift(timedelta(minutes=20))
    assert alerts_check_idle(now=timezone.now()).released == []
    booking.refresh_from_db()
    assert booking.released_at is None


def test_an_idle_mail_that_could_not_go_out_waits_in_the_outbox_and_goes_later(booking, gpus, smtp_server, clock):
    minutes(gpus[0], at(1), 40, utilization=0)
    minutes(gpus[1], at(1), 40, utilization=0)
    smtp_server.stop()
    assert alerts_check_idle(now=timezone.now()).holders_told == [booking.pk]
    assert outbox_drain() == {}  # SMTP away: the mail stays, its alerts stay told (no second mail)
    (waiting,) = Notification.objects.filter(kind=Kind.IDLE, sent_at__isnull=True)
    assert waiting.context["gpu_list"] == "GPU 0, GPU 1"

    smtp_server.start()
    clock.shift(timedelta(minutes=1))
    assert alerts_check_idle(now=timezone.now()).holders_told == []
    assert outbox_drain() == {Kind.IDLE: 1}
    (mail,) = smtp_server.wait_for(1)
    assert mail["Subject"] == f"Your GPUs on gpu-a100 are idle (booking #{booking.pk})"
    assert "GPU 0, GPU 1 until" in text_of(mail)
