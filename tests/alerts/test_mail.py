"""Staff mail about alerts: real SMTP (aiosmtpd), each alert once whatever runs twice or at once,
at most ALERT_MAILS_PER_KIND_PER_HOUR mails per kind per hour with the rest in one summary, and one
end to end through a real Celery worker."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from celery.contrib.testing.worker import start_worker
from django.db import connection
from django.utils import timezone

from alerts.models import Alert
from alerts.selectors import alert_data
from alerts.staff_mail import _claim, alerts_mail_staff, mail_staff
from nodes.models import NodeEvent
from portal.celery import app
from tests.alerts.helpers import event, report
from tests.factories import UserFactory
from tests.mailserver import html_of, text_of


@pytest.fixture
def staff(carol):
    """carol (admin, carol@lab.example) and another staff member; alice is not staff."""
    return [carol, UserFactory(username="dora", is_staff=True)]


def hot(node, gpu):
    report(node, gpu, temperature_c=92)
    report(node, gpu, temperature_c=93)


def test_staff_get_one_mail_per_opened_alert_even_when_the_task_runs_twice(
    node, gpus, staff, alice, smtp_server, settings, clock
):
    settings.ALERT_EMAILS = ["noc@lab.example"]
    hot(node, gpus[2])
    assert alerts_mail_staff(now=timezone.now()) == 1
    assert alerts_mail_staff(now=timezone.now()) == 0  # a second beat, a retry: nothing more

    (mail,) = smtp_server.wait_for(1)
    assert mail["Subject"] == "[GPU alert] GPU too hot: gpu-a100/GPU 2"
    assert set(mail["X-Envelope-To"].split(", ")) == {"carol@lab.example", "dora@lab.example", "noc@lab.example"}
    assert "93 °C (alert at 85 °C, slowdown at 95 °C)" in text_of(mail)
    assert "/admin/alerts/alert/" in html_of(mail)
    assert Alert.objects.get().notified_at == timezone.now()


def test_idle_gpus_and_resolutions_are_not_mailed_to_staff(node, gpus, staff, smtp_server, clock):
    hot(node, gpus[0])
    alerts_mail_staff(now=timezone.now())
    report(node, gpus[0], temperature_c=60)  # resolved: no second mail
    Alert.objects.create(kind="idle", node=node, gpu=gpus[1], opened_at=timezone.now(), last_bad_at=timezone.now())
    assert alerts_mail_staff(now=timezone.now()) == 0
    assert len(smtp_server.wait_for(2, timeout=1)) == 1


def test_a_flapping_gpu_is_rate_limited_and_the_rest_goes_in_one_summary(
    node, gpus, staff, smtp_server, settings, clock
):
    settings.ALERT_MAILS_PER_KIND_PER_HOUR = 3
    for _ in range(6):  # hot, hot (open), cool (resolve): six alerts in a few minutes
        hot(node, gpus[1])
        alerts_mail_staff(now=timezone.now())
        report(node, gpus[1], temperature_c=60)
        clock.shift(timedelta(minutes=1))
    assert len(smtp_server.wait_for(4, timeout=1)) == 3
    assert Alert.objects.filter(notified_at__isnull=True).count() == 3  # held back, shown on the status page

    # Other kinds have their own allowance.
    event(node, NodeEvent.Kind.VIOLATION, gpus[0], "mallory")
    assert alerts_mail_staff(now=timezone.now()) == 1

    clock.shift(timedelta(hours=1))
    assert alerts_mail_staff(now=timezone.now()) == 1  # the three held back, together
    summary = smtp_server.wait_for(5)[-1]
    assert summary["Subject"] == "[GPU alert] 3 alerts: GPU too hot"
    assert text_of(summary).count("resolved since") == 3
    assert not Alert.objects.filter(notified_at__isnull=True).exists()


def test_a_mail_that_fails_is_given_back_and_sent_by_the_next_run(node, gpus, staff, smtp_server, settings, clock):
    hot(node, gpus[0])
    settings.EMAIL_PORT = 1  # nothing listens there
    with pytest.raises(OSError):
        alerts_mail_staff(now=timezone.now())
    assert Alert.objects.get().notified_at is None

    settings.EMAIL_PORT = smtp_server.port
    assert alerts_mail_staff(now=timezone.now()) == 1
    assert len(smtp_server.wait_for(1)) == 1


def test_a_mail_whose_sender_died_after_claiming_goes_once_the_claim_expires(
    node, gpus, staff, smtp_server, settings, clock
):
    settings.NOTIFY_CLAIM_SECONDS = 300
    hot(node, gpus[0])
    (claimed,) = _claim("temperature", timezone.now())  # a run claimed it, then its worker was killed
    alert = Alert.objects.get()
    assert alert.notified_at is not None and not alert_data(alert)["mailed"]  # the page: not mailed yet

    clock.shift(timedelta(seconds=299))
    assert alerts_mail_staff(now=timezone.now()) == 0  # the claim holds
    clock.shift(timedelta(seconds=1))
    assert alerts_mail_staff(now=timezone.now()) == 1
    assert alerts_mail_staff(now=timezone.now()) == 0
    (mail,) = smtp_server.wait_for(2, timeout=1)
    assert mail["Subject"] == "[GPU alert] GPU too hot: gpu-a100/GPU 0"
    alert.refresh_from_db()
    assert (alert.mail_id, alert.mailed_at) == (claimed.mail_id, timezone.now())
    assert alert_data(alert)["mailed"]


@pytest.mark.postgres_only
@pytest.mark.skipif(connection.vendor != "postgresql", reason="parallel connections: PostgreSQL")
def test_two_runs_at_once_send_each_alert_once(transactional_db, node, gpus, staff, smtp_server, settings):
    settings.ALERT_MAILS_PER_KIND_PER_HOUR = 2
    for gpu in gpus:
        hot(node, gpu)
    start = threading.Barrier(2)
    sent, errors = [], []

    def run():
        try:
            start.wait()
            sent.append(alerts_mail_staff(now=timezone.now()))
        except Exception as exc:  # reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert sorted(sent) == [0, 2]  # one run took both mails the hour allows; the other found none
    mails = smtp_server.wait_for(3, timeout=2)
    assert [m["Subject"] for m in mails].count("[GPU alert] 3 alerts: GPU too hot") == 1
    assert len(mails) == 2
    assert not Alert.objects.filter(notified_at__isnull=True).exists()


def test_an_alert_mail_goes_out_through_a_real_celery_worker(transactional_db, node, gpus, staff, smtp_server):
    with start_worker(app, pool="solo", perform_ping_check=False, shutdown_timeout=10):
        event(node, NodeEvent.Kind.VIOLATION, gpus[1], "mallory", pid=31337, message="no booking for mallory")
        mails = smtp_server.wait_for(1, timeout=15)
    assert [m["Subject"] for m in mails] == ["[GPU alert] Use without a booking: gpu-a100/GPU 1 (mallory)"]
    assert "pids 31337" in text_of(mails[0])
    assert mail_staff.name == "alerts.mail_staff"
