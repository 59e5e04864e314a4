"""Beat liveness with the real processes: celery beat in its own process, a real Celery worker,
agent heartbeats over the API, the status page, /metrics and staff mail over real SMTP."""

# Tests run fixed argument lists (never a shell).
# ruff: noqa: S603

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from celery.contrib.testing.worker import start_worker
from django.conf import settings
from django.db import connection
from django.db.models import F
from django.test import Client
from django.utils import timezone

from alerts.jobs import HEADER
from alerts.models import Alert, PeriodicJob
from alerts.staff_mail import mail_staff
from alerts.tasks import check_idle
from portal.celery import app
from tests.agent.harness import wait_for
from tests.mailserver import subject_of, text_of
from tests.metrics.conftest import TOKEN, value
from tests.nodes.queues import purge
from tests.nodes.test_agent_reports import HEARTBEAT, agent_client, heartbeat

ROOT = Path(__file__).resolve().parents[2]
# Three jobs made fast for beat in the test (their periods are settings); the others keep theirs. The
# portal (this process) keeps the default periods: 10 s, 60 s and 300 s.
FAST = {"NOTIFY_SCAN_SECONDS": "1", "STATUS_REFRESH_SECONDS": "1", "USAGE_ROLLUP_SECONDS": "1"}
FAST_JOBS = {"send-due-mail", "refresh-status", "rollup-usage"}

pytestmark = [pytest.mark.postgres_only, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def postgres_only():
    if connection.vendor != "postgresql":
        pytest.skip("the worker and beat share the test database: PostgreSQL")


@pytest.fixture
def worker():
    purge("celery")
    with start_worker(app, pool="solo", perform_ping_check=False, shutdown_timeout=10) as running:
        yield running
    purge("celery")


def start_beat(folder: Path) -> subprocess.Popen[bytes]:
    log = (folder / "beat.log").open("ab")
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "portal", "beat", "--schedule", str(folder / "schedule")],
        cwd=ROOT,
        env={**os.environ, "REDIS_URL": settings.REDIS_URL, **FAST},
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def stop(process: subprocess.Popen[bytes]) -> None:
    """Kill beat (no goodbye), and let the worker finish what beat had queued: the records settle."""
    process.kill()
    process.wait(timeout=10)
    purge("celery")

    def records() -> list[tuple[str, object]]:
        return list(PeriodicJob.objects.order_by("name").values_list("name", "last_success_at"))

    seen: list[list[tuple[str, object]]] = [records()]

    def settled() -> bool:
        seen.append(records())
        return seen[-1] == seen[-2]

    assert wait_for(settled, timeout=20, interval=1.5)


def test_only_successful_runs_that_beat_started_are_recorded(worker):
    check_idle.apply_async()  # the task of "idle-gpus", not started by beat
    app.send_task("alerts.check_idle", kwargs={"bogus": 1}, headers={HEADER: "idle-gpus"})  # fails
    mail_staff.apply_async(headers={HEADER: "alert-mail"})  # as beat sends it
    recorded = PeriodicJob.objects.filter(name="alert-mail", last_success_at__isnull=False)
    assert wait_for(recorded.exists, timeout=20)
    # The solo worker runs them in order: the two before had run, and neither counted.
    assert not PeriodicJob.objects.filter(name="idle-gpus").exists()
    assert recorded.get().task == "alerts.mail_staff"


def test_killing_beat_opens_the_jobs_late_alert_for_admins_and_its_return_resolves_it(
    worker, node, carol, alice, smtp_server, settings, tmp_path
):
    settings.JOBS_LATE_CHECK_SECONDS = 0  # every heartbeat checks (30 s per process by default)
    settings.METRICS_TOKEN, settings.METRICS_ALLOWED_IPS = TOKEN, []
    agent = agent_client(node)

    beat = start_beat(tmp_path)
    try:
        ran = PeriodicJob.objects.filter(name__in=FAST_JOBS, last_success_at__isnull=False)
        assert wait_for(lambda: ran.count() == len(FAST_JOBS), timeout=40, interval=0.2), (
            tmp_path / "beat.log"
        ).read_text()
    finally:
        stop(beat)
    assert agent.post(HEARTBEAT, heartbeat(), format="json").status_code == 200
    assert not Alert.objects.filter(kind="jobs_late").exists()

    # Beat is dead and its jobs stop. Twenty minutes pass, for the records (more than three periods of
    # each): a test does not wait that long, and the worker must keep the real clock.
    PeriodicJob.objects.filter(name__in=FAST_JOBS).update(last_success_at=F("last_success_at") - timedelta(minutes=20))
    assert agent.post(HEARTBEAT, heartbeat(), format="json").status_code == 200
    (alert,) = Alert.objects.filter(kind="jobs_late", resolved_at__isnull=True)
    assert {job["name"] for job in alert.details["jobs"]} == FAST_JOBS
    assert alert.node is None

    # Staff are mailed, by the worker nudged when the alert opened.
    (mail,) = smtp_server.wait_for(1, timeout=30)
    assert subject_of(mail) == "[GPU alert] Periodic jobs late"
    assert "send-due-mail (every 60 s): no success for 20 min" in text_of(mail)

    # The status page shows it to admins, not to researchers.
    page = Client()
    page.force_login(carol)
    html = page.get("/status/").content.decode()
    data = html[html.index('id="alerts-data"') :]
    (shown,) = json.loads(data[data.index(">") + 1 : data.index("</script>")])
    assert (shown["kind"], shown["node"]) == ("jobs_late", None) and "rollup-usage" in shown["summary"]
    page.force_login(alice)
    assert "Periodic jobs late" not in page.get("/status/").content.decode()

    # /metrics exports each job's age and period, and which are late.
    metrics = Client(HTTP_AUTHORIZATION=f"Bearer {TOKEN}").get("/metrics").content.decode()
    labels = {"job": "send-due-mail", "task": "notifications.send_due"}
    assert 1200 <= value(metrics, "gpubook_periodic_job_last_success_age_seconds", **labels) < 1300
    assert value(metrics, "gpubook_periodic_job_period_seconds", **labels) == 60
    assert value(metrics, "gpubook_periodic_job_late", **labels) == 1
    assert value(metrics, "gpubook_periodic_job_late", job="prune-usage", task="nodes.prune_usage") == 0

    # Beat comes back: its jobs run, and the next heartbeat resolves the alert.
    back = timezone.now()
    beat = start_beat(tmp_path)
    try:
        fresh = PeriodicJob.objects.filter(name__in=FAST_JOBS, last_success_at__gt=back)
        assert wait_for(lambda: fresh.count() == len(FAST_JOBS), timeout=40, interval=0.2)
    finally:
        stop(beat)
    assert agent.post(HEARTBEAT, heartbeat(), format="json").status_code == 200
    alert.refresh_from_db()
    assert alert.resolved_at is not None and alert.resolution == "the periodic jobs ran again"
    metrics = Client(HTTP_AUTHORIZATION=f"Bearer {TOKEN}").get("/metrics").content.decode()
    assert value(metrics, "gpubook_periodic_job_last_success_age_seconds", **labels) < 60
    assert value(metrics, "gpubook_periodic_job_late", **labels) == 0
