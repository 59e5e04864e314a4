"""Mail to researchers and admins, sent over real SMTP to a local aiosmtpd server and read back
from what arrived; time moved with time-machine. The outbox's own guarantees (written with the
change, sent at least once, never twice at once) are in test_outbox.py."""

from __future__ import annotations

import re
import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.test import Client
from django.utils import timezone

from nodes.ingest import telemetry_record
from nodes.models import GpuTelemetry
from notifications.models import Kind, MailPreferences, Notification
from notifications.services import send_due
from portal.celery import app
from reservations.services import (
    reservation_approve,
    reservation_extend,
    reservation_reject,
)
from tests.conftest import at
from tests.factories import book, node_with_gpus
from tests.mailserver import html_of, subject_of, text_of

pytestmark = pytest.mark.usefixtures("clock")


@pytest.fixture
def eager_tasks():
    """Tasks queued after a commit run at once, in the test (the end-to-end test uses a worker)."""
    app.conf.task_always_eager = True
    yield
    app.conf.task_always_eager = False


# --- when a booking changes -------------------------------------------------------------------


def test_a_confirmed_booking_mails_its_owner_how_to_use_the_gpus(
    eager_tasks, smtp_server, django_capture_on_commit_callbacks, alice, gpus
):
    with django_capture_on_commit_callbacks(execute=True):
        reservation = book(alice, gpus[:2], at(1), at(3), purpose="fine-tuning")
    [mail] = smtp_server.wait_for(1)
    assert mail["To"] == "alice@lab.example"
    assert subject_of(mail) == "Booked: gpu-a100 GPU 0, 1, 2030-01-07 10:00–12:00 UTC"
    text = text_of(mail)
    assert f"Booking #{reservation.pk}" in text
    assert f"ssh {gpus[0].node.hostname}" in text
    assert f"export CUDA_VISIBLE_DEVICES={gpus[0].uuid},{gpus[1].uuid}" in text
    assert "fine-tuning" in text
    assert "http://127.0.0.1:8000/profile/mail/" in text
    html = html_of(mail)
    assert "<strong>confirmed</strong>" in html and f"CUDA_VISIBLE_DEVICES={gpus[0].uuid}" in html


def test_times_are_in_the_readers_zone(eager_tasks, smtp_server, django_capture_on_commit_callbacks, alice, gpus):
    alice.timezone = "America/New_York"
    alice.save()
    with django_capture_on_commit_callbacks(execute=True):
        book(alice, [gpus[0]], at(1), at(3))
    [mail] = smtp_server.wait_for(1)
    assert "2030-01-07 05:00–07:00 EST" in subject_of(mail)


def test_a_booking_waiting_for_approval_mails_its_owner_and_every_admin(
    eager_tasks, smtp_server, django_capture_on_commit_callbacks, alice, bob, carol
):
    node = node_with_gpus(2, name="gpu-h100", requires_approval=True)
    gpu = node.gpus.first()
    with django_capture_on_commit_callbacks(execute=True):
        reservation = book(alice, [gpu], at(1), at(3))
    mails = {message["To"]: message for message in smtp_server.wait_for(2)}
    assert set(mails) == {"alice@lab.example", "carol@lab.example"}  # not bob, a researcher
    assert subject_of(mails["alice@lab.example"]).startswith("Waiting for approval: gpu-h100 GPU 0")
    assert subject_of(mails["carol@lab.example"]).startswith("Approval needed: alice on gpu-h100")
    assert "http://127.0.0.1:8000/reservations/pending/" in text_of(mails["carol@lab.example"])

    smtp_server.clear()
    with django_capture_on_commit_callbacks(execute=True):
        reservation_approve(reservation=reservation, actor=carol, reason="go ahead")
    [approved] = smtp_server.wait_for(1)
    assert approved["To"] == "alice@lab.example"
    assert subject_of(approved).startswith("Approved: gpu-h100")
    assert "approved by carol" in text_of(approved) and '"go ahead"' in text_of(approved)


def test_a_rejection_says_why(eager_tasks, smtp_server, django_capture_on_commit_callbacks, alice, carol):
    node = node_with_gpus(1, name="gpu-h100", requires_approval=True)
    with django_capture_on_commit_callbacks(execute=True):
        reservation = book(alice, [node.gpus.first()], at(1), at(2))
    smtp_server.wait_for(2)
    smtp_server.clear()
    with django_capture_on_commit_callbacks(execute=True):
        reservation_reject(reservation=reservation, actor=carol, reason="the node is reserved for the course")
    [rejected] = smtp_server.wait_for(1)
    assert subject_of(rejected).startswith("Rejected: gpu-h100")
    assert '"the node is reserved for the course"' in text_of(rejected)


def test_a_kind_turned_off_is_not_sent_and_is_recorded_as_skipped(
    eager_tasks, smtp_server, django_capture_on_commit_callbacks, alice, gpus
):
    MailPreferences.objects.create(user=alice, booking_received=False)
    with django_capture_on_commit_callbacks(execute=True):
        reservation = book(alice, [gpus[0]], at(1), at(2))
    assert smtp_server.wait_for(1, timeout=0.5) == []
    note = Notification.objects.get(reservation=reservation)
    assert (note.kind, note.skipped, note.sent_at is not None) == (Kind.BOOKING_CONFIRMED, True, True)


# --- what is due ------------------------------------------------------------------------------


def test_a_slot_starting_is_mailed_once_with_how_to_use_it(booked, smtp_server, clock, alice, gpus):
    reservation = booked(alice, [gpus[1]], at(1), at(3))
    assert send_due(at(0.5))[Kind.SLOT_STARTING] == 0
    clock.move_to(at(1, days=0) + timedelta(seconds=30))
    assert send_due()[Kind.SLOT_STARTING] == 1
    assert send_due()[Kind.SLOT_STARTING] == 0  # the next beat: already sent
    [mail] = smtp_server.wait_for(1)
    assert subject_of(mail).startswith("Your GPUs are ready: gpu-a100 GPU 1 until 2030-01-07 12:00")
    assert f"export CUDA_VISIBLE_DEVICES={gpus[1].uuid}" in text_of(mail)
    assert Notification.objects.get(kind=Kind.SLOT_STARTING).reservation == reservation


def test_the_reminder_comes_the_chosen_minutes_before_the_end_and_offers_to_extend(
    booked, smtp_server, clock, alice, bob, gpus
):
    alice.remind_before_end_minutes = 20
    alice.save()
    reservation = booked(alice, [gpus[0]], at(1), at(2))
    clock.move_to(at(2) - timedelta(minutes=25))
    assert send_due()[Kind.SLOT_ENDING] == 0
    clock.move_to(at(2) - timedelta(minutes=20))
    assert send_due()[Kind.SLOT_ENDING] == 1
    reminder = next(m for m in smtp_server.wait_for(2) if "left" in subject_of(m))
    assert subject_of(reminder) == "20 min left on gpu-a100 GPU 0"
    assert "extend it here: http://127.0.0.1:8000/reservations/mine/" in text_of(reminder)
    assert "Extend the slot" in html_of(reminder)

    # Extended: a new end, a new reminder; and now someone follows right after.
    reservation_extend(reservation=reservation, actor=alice, end=at(3))
    booked(bob, [gpus[0]], at(3), at(4))
    clock.move_to(at(3) - timedelta(minutes=19))
    assert send_due()[Kind.SLOT_ENDING] == 1
    [again] = [m for m in smtp_server.wait_for(1) if "left" in subject_of(m)]
    assert subject_of(again) == "19 min left on gpu-a100 GPU 0"
    assert "cannot be extended" in text_of(again)


def test_no_reminder_for_those_who_asked_for_none(booked, smtp_server, clock, alice, gpus):
    alice.remind_before_end_minutes = 0
    alice.save()
    booked(alice, [gpus[0]], at(1), at(2))
    clock.move_to(at(2) - timedelta(minutes=1))
    assert send_due()[Kind.SLOT_ENDING] == 0


def test_a_slot_that_ended_is_mailed_with_its_usage_even_after_downtime(booked, smtp_server, clock, alice, node, gpus):
    reservation = booked(alice, gpus[:2], at(1), at(2))
    for minute, (first, second) in enumerate([(90, 10), (70, 30)]):
        when = at(1) + timedelta(minutes=10 + minute)
        samples = [
            {"uuid": gpus[0].uuid, "utilization_pct": first, "memory_used_mib": 40960, "processes": []},
            {"uuid": gpus[1].uuid, "utilization_pct": second, "memory_used_mib": 2048, "processes": []},
        ]
        # 400 W and 200 W for the minute between the readings; GPU 1 has no counter (its power added up).
        samples[0] |= {"energy_mj": 24_000_000 * minute}
        samples[1] |= {"energy_mj": 12_000_000 * minute, "energy_estimated": True}
        telemetry_record(node=node, samples=samples, now=when)
    assert GpuTelemetry.objects.count() == 2

    # The portal was down at the end: two hours later the mail still goes, once.
    clock.move_to(at(4))
    assert send_due()[Kind.SLOT_ENDED] == 1
    assert send_due()[Kind.SLOT_ENDED] == 0
    [mail] = [m for m in smtp_server.wait_for(2) if subject_of(m).startswith("Slot ended")]
    assert subject_of(mail) == "Slot ended: gpu-a100 GPU 0, 1, 50 % used"
    text = text_of(mail)
    assert "Mean utilisation: 50 %" in text
    assert "Peak memory:      40.0 GB" in text
    assert "Minutes with readings: 2" in text
    assert "Energy:           about 0.010 kWh, of which 0.000 kWh in idle minutes" in text  # both were busy
    assert Notification.objects.filter(reservation=reservation, kind=Kind.SLOT_ENDED).count() == 1


def test_an_ended_mail_too_late_to_matter_is_not_sent(booked, smtp_server, clock, alice, gpus, settings):
    settings.NOTIFY_ENDED_CATCHUP_HOURS = 6
    booked(alice, [gpus[0]], at(1), at(2))
    clock.move_to(at(9))
    assert send_due()[Kind.SLOT_ENDED] == 0
    assert not Notification.objects.filter(kind=Kind.SLOT_ENDED).exists()


def test_a_mail_that_could_not_go_out_is_sent_by_a_later_scan(booked, smtp_server, clock, alice, gpus):
    booked(alice, [gpus[0]], at(1), at(3))
    clock.move_to(at(1) + timedelta(minutes=1))
    smtp_server.stop()
    assert send_due()[Kind.SLOT_STARTING] == 0  # SMTP refused: logged, tried again in a minute
    note = Notification.objects.get(kind=Kind.SLOT_STARTING)
    assert (note.sent_at, note.attempts) == (None, 1) and "Connection refused" in note.last_error
    smtp_server.start()
    assert send_due()[Kind.SLOT_STARTING] == 0  # the same beat again: the retry is not due yet
    clock.shift(timedelta(minutes=1))
    assert send_due()[Kind.SLOT_STARTING] == 1
    assert len(smtp_server.wait_for(1)) == 1
    note.refresh_from_db()
    assert (note.sent_at, note.claimed_until, note.last_error) == (timezone.now(), None, "")


@pytest.mark.postgres_only
@pytest.mark.django_db(transaction=True)
def test_two_beats_at_once_send_one_mail(booked, smtp_server, clock, alice, gpus):
    if connection.vendor != "postgresql":
        pytest.skip("parallel connections: PostgreSQL")
    booked(alice, [gpus[0]], at(1), at(3))
    clock.move_to(at(1) + timedelta(minutes=1))
    counts, barrier = [], threading.Barrier(4)

    def beat() -> None:
        barrier.wait()
        try:
            counts.append(send_due()[Kind.SLOT_STARTING])
        finally:
            connection.close()

    threads = [threading.Thread(target=beat) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(counts) == [0, 0, 0, 1]
    assert len(smtp_server.wait_for(2, timeout=1)) == 1


# --- the page ---------------------------------------------------------------------------------


def test_each_person_chooses_their_mails_on_a_page_of_their_own(alice, carol):
    assert Client().get("/profile/mail/").status_code == 302
    page = Client(enforce_csrf_checks=False)
    page.force_login(alice)
    response = page.get("/profile/mail/")
    assert response.status_code == 200
    assert b"Slot ending soon" in response.content
    assert b"Approval needed" not in response.content  # researchers are never asked to approve
    response = page.post("/profile/mail/", {"decisions": "on", "slot_ending": "on"}, follow=True)
    assert b"Your mail choices are saved." in response.content
    choices = MailPreferences.objects.get(user=alice)
    assert (choices.booking_received, choices.decisions, choices.slot_ending, choices.slot_ended) == (
        False,
        True,
        True,
        False,
    )
    admin_page = Client()
    admin_page.force_login(carol)
    assert b"Approval needed" in admin_page.get("/profile/mail/").content


def test_the_mail_page_refuses_a_forged_post(alice):
    page = Client(enforce_csrf_checks=True)
    page.force_login(alice)
    assert page.post("/profile/mail/", {"decisions": "on"}).status_code == 403
    assert not MailPreferences.objects.filter(user=alice, booking_received=False).exists()


def test_the_html_part_reads_in_order_to_a_screen_reader(
    eager_tasks, smtp_server, django_capture_on_commit_callbacks, alice, gpus
):
    with django_capture_on_commit_callbacks(execute=True):
        book(alice, gpus[:1], at(1), at(3), purpose="fine-tuning")
    [mail] = smtp_server.wait_for(1)
    html = html_of(mail)
    subject = subject_of(mail)
    assert '<html lang="en">' in html
    assert f"<title>{subject}</title>" in html
    # The subject is the one heading, before the text; the booking's facts are a table of labelled rows.
    assert html.count("<h1") == 1 and f">{subject}</h1>" in html
    assert html.index("</h1>") < html.index("Hello alice")
    rows = re.findall(r'<th scope="row"[^>]*>([^<]+)</th>', html)
    assert rows == ["Booking", "Node", "GPUs", "When", "Purpose"]
    assert 'role="presentation"' not in html
