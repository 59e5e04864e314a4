"""The mail outbox: a change's mails are written in its own transaction, sent at least once (a
sender that dies leaves a claim that expires), never by two senders at once, skipped with a reason
when they no longer apply, and given up after a day. Real SMTP (aiosmtpd), the clock moved with
time-machine; the broker down and a real worker and beat are in test_end_to_end.py."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from notifications.models import Kind, Notification
from notifications.services import notification_claim, outbox_drain, send_due
from reservations.models import Reservation
from reservations.services import reservation_approve, reservation_cancel, reservation_create, reservation_extend
from tests.conftest import at
from tests.factories import node_with_gpus
from tests.mailserver import subject_of, text_of
from tests.nodes.queues import messages, purge

pytestmark = pytest.mark.usefixtures("clock")


@pytest.fixture
def approval_gpu(db):
    return node_with_gpus(2, name="gpu-h100", requires_approval=True).gpus.get(index=0)


def test_a_bookings_mails_are_written_with_it_and_beat_sends_them_with_no_nudge(
    smtp_server, alice, bob, carol, approval_gpu
):
    # No on_commit callback runs in this test: no worker is ever nudged, as with the broker down.
    reservation = reservation_create(user=alice, gpus=[approval_gpu], start=at(1), end=at(3))

    waiting = Notification.objects.filter(reservation=reservation, sent_at__isnull=True)
    assert sorted(waiting.values_list("kind", "user__username")) == [
        (Kind.APPROVAL_NEEDED, "carol"),  # every admin with an address, never bob
        (Kind.BOOKING_PENDING, "alice"),
    ]
    assert smtp_server.wait_for(1, timeout=0.3) == []

    assert send_due() == {
        Kind.SLOT_STARTING: 0,
        Kind.SLOT_ENDING: 0,
        Kind.SLOT_ENDED: 0,
        Kind.BOOKING_PENDING: 1,
        Kind.APPROVAL_NEEDED: 1,
    }
    mails = {mail["To"]: mail for mail in smtp_server.wait_for(2)}
    assert subject_of(mails["carol@lab.example"]).startswith("Approval needed: alice on gpu-h100")
    assert not waiting.exists()
    assert send_due()[Kind.SLOT_STARTING] == 0 and len(smtp_server.wait_for(3, timeout=0.3)) == 2


def test_a_change_that_rolls_back_leaves_no_mail(smtp_server, alice, gpus):
    with pytest.raises(RuntimeError), transaction.atomic():
        reservation_create(user=alice, gpus=[gpus[0]], start=at(1), end=at(2))
        assert Notification.objects.count() == 1  # written inside the booking's transaction...
        raise RuntimeError("the caller's transaction fails after the booking")
    assert not Reservation.objects.exists() and not Notification.objects.exists()  # ...and gone with it
    assert outbox_drain() == {}


def test_a_committed_change_nudges_a_worker_for_its_booking_and_one_without_mail_does_not(
    django_capture_on_commit_callbacks, alice, gpus
):
    purge("celery")
    with django_capture_on_commit_callbacks(execute=True):
        reservation = reservation_create(user=alice, gpus=[gpus[0]], start=at(1), end=at(2))
    [nudge] = messages("celery", task="notifications.send_outbox")
    assert nudge["expires"] is not None

    with django_capture_on_commit_callbacks(execute=True):
        reservation_cancel(reservation=reservation, actor=alice)  # a cancellation mails nobody
    assert len(messages("celery", task="notifications.send_outbox")) == 1
    purge("celery")


def test_a_sender_that_died_after_claiming_has_the_mail_sent_once_its_claim_expires(
    smtp_server, clock, alice, gpus, settings
):
    settings.NOTIFY_CLAIM_SECONDS = 300
    reservation_create(user=alice, gpus=[gpus[0]], start=at(1), end=at(2))
    note = Notification.objects.get()
    assert notification_claim(note.pk, timezone.now())  # a worker took it, then was killed
    assert not notification_claim(note.pk, timezone.now())  # nobody else may take it meanwhile

    assert outbox_drain() == {}
    clock.shift(timedelta(seconds=299))
    assert outbox_drain() == {}
    clock.shift(timedelta(seconds=1))
    assert outbox_drain() == {Kind.BOOKING_CONFIRMED: 1}
    assert outbox_drain() == {} and send_due()[Kind.SLOT_STARTING] == 0
    [mail] = smtp_server.wait_for(2, timeout=0.5)
    assert subject_of(mail).startswith("Booked: gpu-a100 GPU 0")
    note.refresh_from_db()
    assert (note.attempts, note.sent_at, note.skipped) == (2, timezone.now(), False)


def test_approval_needed_is_skipped_when_the_booking_was_decided_before_it_could_go(
    smtp_server, alice, carol, approval_gpu
):
    reservation = reservation_create(user=alice, gpus=[approval_gpu], start=at(1), end=at(3))
    reservation_approve(reservation=reservation, actor=carol, reason="fine")  # the mail was still waiting

    assert outbox_drain() == {Kind.APPROVED: 1}
    [mail] = smtp_server.wait_for(2, timeout=0.5)
    assert mail["To"] == "alice@lab.example" and subject_of(mail).startswith("Approved: gpu-h100")
    skipped = dict(Notification.objects.filter(skipped=True).values_list("kind", "skip_reason"))
    assert skipped == {
        Kind.APPROVAL_NEEDED: "the booking was approved before this mail could go",
        Kind.BOOKING_PENDING: "the booking was approved before this mail could go",
    }


def test_a_mail_that_could_not_go_out_for_a_day_is_given_up_with_the_reason(smtp_server, clock, alice, gpus):
    reservation_create(user=alice, gpus=[gpus[0]], start=at(30), end=at(31))
    smtp_server.stop()
    assert outbox_drain() == {}
    clock.shift(timedelta(hours=24, minutes=1))
    smtp_server.start()
    assert outbox_drain() == {}
    note = Notification.objects.get()
    assert note.skipped and note.skip_reason.startswith("not sent within 24 hours: ConnectionRefusedError")
    assert smtp_server.wait_for(1, timeout=0.3) == []


def test_retries_wait_longer_each_time(smtp_server, clock, alice, gpus):
    reservation_create(user=alice, gpus=[gpus[0]], start=at(30), end=at(31))
    smtp_server.stop()
    waits = []
    for _ in range(4):
        outbox_drain()
        note = Notification.objects.get()
        waits.append(note.claimed_until - timezone.now())
        clock.move_to(note.claimed_until)
    assert waits == [timedelta(minutes=1), timedelta(minutes=2), timedelta(minutes=4), timedelta(minutes=8)]
    smtp_server.start()
    assert outbox_drain() == {Kind.BOOKING_CONFIRMED: 1}


def test_an_extension_waiting_for_approval_asks_the_admins_and_its_approval_is_mailed(
    smtp_server, alice, carol, approval_gpu
):
    booking = reservation_create(user=alice, gpus=[approval_gpu], start=at(1), end=at(3))
    reservation_approve(reservation=booking, actor=carol)
    outbox_drain()
    smtp_server.clear()

    reservation_extend(reservation=booking, actor=alice, end=at(5))
    extension = Reservation.objects.get(extends=booking)
    assert outbox_drain() == {Kind.BOOKING_PENDING: 1, Kind.APPROVAL_NEEDED: 1}
    asked = next(mail for mail in smtp_server.wait_for(2) if mail["To"] == "carol@lab.example")
    assert f"#{extension.pk}" in text_of(asked)

    smtp_server.clear()
    reservation_approve(reservation=extension, actor=carol)
    assert outbox_drain() == {Kind.APPROVED: 1}  # a second "approved" for the booking: its new end
    [approved] = smtp_server.wait_for(1)
    assert approved["To"] == "alice@lab.example"
    assert "your extension was approved by carol" in text_of(approved)
    assert Notification.objects.filter(kind=Kind.APPROVED, reservation=booking, moment=at(5)).exists()


def test_a_claim_shorter_than_the_slowest_send_is_refused_by_the_system_check(settings):
    from django.core.management import call_command
    from django.core.management.base import SystemCheckError

    settings.EMAIL_TIMEOUT = 10
    # Six SMTP steps of 10 s may take a minute: a mail still being sent would be claimed again.
    settings.NOTIFY_CLAIM_SECONDS = 60
    with pytest.raises(SystemCheckError, match=r"notifications\.E001.*NOTIFY_CLAIM_SECONDS is 60"):
        call_command("check")
    settings.NOTIFY_CLAIM_SECONDS = 61
    call_command("check")
