"""The reminder the whole way: celery beat (its own process, the portal's schedule) sends the scan,
a real Celery worker runs it, and the mail arrives at a real SMTP server."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from celery.contrib.testing.worker import start_worker
from django.conf import settings
from django.db import connection
from django.utils import timezone

from portal.celery import app
from reservations.models import Allocation, Reservation
from tests.mailserver import subject_of, text_of
from tests.nodes.queues import purge

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.postgres_only
@pytest.mark.django_db(transaction=True)
def test_beat_and_a_worker_send_the_reminder_before_a_slot_ends(smtp_server, alice, gpus, tmp_path):
    if connection.vendor != "postgresql":
        pytest.skip("the worker thread and the test share the database: PostgreSQL")
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
    beat = subprocess.Popen(  # noqa: S603 - our own interpreter and module
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
