"""Mail the whole way, with the real processes: celery beat (the portal's schedule) and a Celery
worker in processes of their own, the portal's ASGI server, Redis, and a real SMTP server.

- The reminder before a slot ends: beat sends the scan, a worker runs it, the mail arrives.
- The broker down during a booking: the booking stands, its mails wait in the outbox, and once
  Redis is back beat's drain sends the admin's "approval needed".
- A sender that died after claiming a mail: the claim expires, the drain sends it, once.
"""

# Tests run fixed argument lists (never a shell).
# ruff: noqa: S603, S607

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import pytest
import requests
from celery.contrib.testing.worker import start_worker
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from accounts.services import api_token_create
from alerts.models import PeriodicJob
from notifications.models import Kind, Notification
from notifications.services import notification_claim
from portal.celery import app
from reservations.models import Allocation, Reservation
from reservations.services import reservation_create
from reservations.timegrid import ceil_to_grid
from tests.agent.harness import PrivateRedis, port_open, wait_for
from tests.factories import node_with_gpus
from tests.live.server import AsgiServer, database_url
from tests.mailserver import subject_of, text_of
from tests.nodes.queues import purge

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.postgres_only, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def postgres_only():
    if connection.vendor != "postgresql":
        pytest.skip("the worker and beat share the test database: PostgreSQL")


class RestartableRedis(PrivateRedis):
    """A private Redis that can come back on the same port, as a restarted broker does."""

    def restart(self) -> None:
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        if wait_for(lambda: port_open(self.port), timeout=10) is None:
            raise RuntimeError("the private redis-server did not start again")


def celery(*args: str, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "portal", *args, "--loglevel", "INFO"],
            cwd=ROOT,
            env={**os.environ, **env},
            stdout=out,
            stderr=subprocess.STDOUT,
        )


@contextmanager
def beat_and_worker(tmp_path: Path, **env: str) -> Iterator[Path]:
    """celery beat and a worker, each its own process, on the test database; yields the log folder."""
    env = {"DATABASE_URL": database_url(), "SECRET_KEY": settings.SECRET_KEY, "NOTIFY_SCAN_SECONDS": "1", **env}
    worker = celery("worker", "--pool", "solo", "--without-mingle", "--without-gossip", env=env, log=tmp_path / "w.log")
    beat = celery("beat", "--schedule", str(tmp_path / "beat-schedule"), env=env, log=tmp_path / "beat.log")
    try:
        yield tmp_path
    finally:
        for process in (beat, worker):
            process.terminate()
        for process in (beat, worker):
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def logs(folder: Path) -> str:
    return "\n".join(path.read_text(errors="replace")[-3000:] for path in sorted(folder.glob("*.log")))


def smtp_url(server) -> str:
    return f"smtp://127.0.0.1:{server.port}"


def test_beat_and_a_worker_send_the_reminder_before_a_slot_ends(smtp_server, alice, gpus, tmp_path):
    alice.remind_before_end_minutes = 15
    alice.save()
    now = timezone.now()
    booking = Reservation.objects.create(
        user=alice,
        node=gpus[0].node,
        start=now - timedelta(minutes=30),
        end=now + timedelta(minutes=10),
        status=Reservation.Status.APPROVED,
        created_by=alice,
    )
    Allocation.objects.create(reservation=booking, gpu=gpus[0], start=booking.start, end=booking.end)

    purge("celery")
    beat = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "portal",
            "beat",
            "--loglevel",
            "INFO",
            "--schedule",
            str(tmp_path / "beat-schedule"),
        ],
        cwd=ROOT,
        env={**os.environ, "REDIS_URL": settings.REDIS_URL, "NOTIFY_SCAN_SECONDS": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        with start_worker(app, pool="solo", perform_ping_check=False, shutdown_timeout=10):
            mails = smtp_server.wait_for(2, timeout=30)
    finally:
        beat.terminate()
        log = beat.communicate(timeout=10)[0].decode(errors="replace")
        purge("celery")
    subjects = sorted(subject_of(mail) for mail in mails)
    assert len(subjects) == 2, log[-3000:]
    reminder = next(mail for mail in mails if "left on" in subject_of(mail))
    assert subject_of(reminder) in {"10 min left on gpu-a100 GPU 0", "9 min left on gpu-a100 GPU 0"}
    assert "extend it here" in text_of(reminder)
    assert any(subject.startswith("Your GPUs are ready") for subject in subjects)


def test_with_the_broker_down_during_a_booking_the_approval_mail_arrives_once_redis_is_back(
    smtp_server, alice, bob, carol, tmp_path
):
    gpu = node_with_gpus(1, name="gpu-h100", requires_approval=True).gpus.get()
    _, token = api_token_create(user=alice, name="script")
    broker = RestartableRedis()
    web = AsgiServer(REDIS_URL=broker.url)
    web.start()
    try:
        broker.stop()  # the broker is away while alice books
        start = ceil_to_grid(timezone.now() + timedelta(days=1))
        began = time.monotonic()
        response = requests.post(
            f"{web.url}/api/v1/reservations/",
            json={"gpus": [gpu.pk], "start": start.isoformat(), "end": (start + timedelta(hours=2)).isoformat()},
            headers={"Authorization": f"Bearer {token}"},
            timeout=60,
        )
        assert response.status_code == 201, response.text + web.log()
        assert response.json()["status"] == "pending"
        assert time.monotonic() - began < 5  # no waiting on the broker: the drain is the retry
        reservation = Reservation.objects.get(pk=response.json()["id"])
        waiting = Notification.objects.filter(reservation=reservation, sent_at__isnull=True)
        assert sorted(waiting.values_list("kind", "user__username")) == [
            (Kind.APPROVAL_NEEDED, "carol"),
            (Kind.BOOKING_PENDING, "alice"),
        ]
        assert "not queued; beat's drain will send it" in web.log_path.read_text()
        assert smtp_server.wait_for(1, timeout=1) == []

        broker.restart()  # Redis is back: beat and a worker drain the outbox
        with beat_and_worker(tmp_path, REDIS_URL=broker.url, EMAIL_URL=smtp_url(smtp_server)) as folder:
            mails = smtp_server.wait_for(2, timeout=60)
            assert len(mails) == 2, logs(folder)
            time.sleep(3)  # three more drains: nothing goes twice
            assert len(smtp_server.messages) == 2
    finally:
        web.stop()
        broker.stop()
    to = {mail["To"]: mail for mail in mails}
    assert set(to) == {"alice@lab.example", "carol@lab.example"}
    assert subject_of(to["carol@lab.example"]).startswith("Approval needed: alice on gpu-h100")
    assert not waiting.exists()


def test_a_sender_that_died_after_claiming_has_its_mail_sent_by_the_drain_once_the_claim_expires(
    smtp_server, alice, gpus, tmp_path, settings
):
    settings.NOTIFY_CLAIM_SECONDS = 8  # the worker below gets the same
    purge("celery")
    env = {"REDIS_URL": settings.REDIS_URL, "EMAIL_URL": smtp_url(smtp_server), "NOTIFY_CLAIM_SECONDS": "8"}
    with beat_and_worker(tmp_path, **env) as folder:
        # Beat and the worker are up once a drain has run (its success is recorded: alerts/jobs.py).
        drained = PeriodicJob.objects.filter(name="send-due-mail", last_success_at__isnull=False)
        assert wait_for(drained.exists, timeout=30, interval=0.2), logs(folder)

        start = ceil_to_grid(timezone.now() + timedelta(days=1))
        with transaction.atomic():  # the booking's nudge goes at commit: the mail is claimed by then
            reservation_create(user=alice, gpus=[gpus[0]], start=start, end=start + timedelta(hours=1))
            note = Notification.objects.get()
            assert notification_claim(note.pk, timezone.now())  # a sender took it, and died
        claimed = time.monotonic()

        mails = smtp_server.wait_for(1, timeout=40)
        arrived = time.monotonic()
        assert len(mails) == 1, logs(folder)
        time.sleep(3)  # three more drains: still one mail
        assert len(smtp_server.messages) == 1
    purge("celery")
    assert arrived - claimed >= 7  # the nudge and every drain before the claim expired left it alone
    assert subject_of(mails[0]).startswith("Booked: gpu-a100 GPU 0")
    note.refresh_from_db()
    assert note.sent_at is not None and note.attempts == 2
