"""Is beat alive: every job of the schedule records its last success, and agent heartbeats open
"periodic jobs late" when one is more than three periods late, shown to admins and mailed to staff,
resolved when the jobs run again. Time moved with time-machine; real Celery worker and beat in
test_jobs_end_to_end.py."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from celery.schedules import crontab, schedule
from django.test import Client
from django.utils import timezone

from alerts.conditions import alerts_check_jobs
from alerts.jobs import HEADER, LATE_AT_LEAST, job_states, job_succeeded, period_of, tag_schedule
from alerts.models import Alert, PeriodicJob
from alerts.staff_mail import alerts_mail_staff
from nodes.ingest import agent_heartbeat_record
from portal.celery import app
from tests.alerts.test_conditions import heartbeat_data
from tests.mailserver import subject_of, text_of

pytestmark = [pytest.mark.usefixtures("clock"), pytest.mark.django_db]


def jobs_late() -> list[Alert]:
    return list(Alert.objects.filter(kind="jobs_late", resolved_at__isnull=True))


def all_ran(now) -> None:
    for name, entry in app.conf.beat_schedule.items():
        job_succeeded(name=name, task=entry["task"], now=now)


def heartbeat(node) -> None:
    agent_heartbeat_record(node=node, data=heartbeat_data(), now=timezone.now())


class SunriseSchedule:
    """A schedule of another sort (like celery's solar, which needs the ephem library)."""

    def is_due(self, last_run_at):  # pragma: no cover - beat's interface, never called here
        return (False, 3600)


@pytest.fixture
def check_every_heartbeat(settings):
    settings.JOBS_LATE_CHECK_SECONDS = 0


def test_every_entry_of_the_schedule_names_itself_to_the_worker():
    # portal/celery.py tags the whole schedule, so an entry added there later is watched as it is.
    for name, entry in app.conf.beat_schedule.items():
        assert entry["options"]["headers"] == {HEADER: name}, name
    schedule_ = {"a": {"task": "x", "schedule": 5.0, "options": {"expires": 4, "headers": {"keep": 1}}}}
    assert tag_schedule(schedule_)["a"]["options"] == {"expires": 4, "headers": {"keep": 1, HEADER: "a"}}


@pytest.mark.parametrize(
    ("entry_schedule", "period"),
    [
        (60.0, timedelta(minutes=1)),
        (10, timedelta(seconds=10)),
        (timedelta(hours=2), timedelta(hours=2)),
        (schedule(timedelta(seconds=30)), timedelta(seconds=30)),
        (crontab(minute=0, hour="*/6"), timedelta(hours=6)),
        (crontab(minute=30, hour=2, day_of_week=1), timedelta(days=7)),
        (crontab(minute=0, hour=9, day_of_week="1-5"), timedelta(days=3)),  # Friday to Monday
        (SunriseSchedule(), timedelta(days=1)),  # not measured: watched as a daily job
    ],
)
def test_the_period_of_each_kind_of_schedule(entry_schedule, period):
    assert period_of(entry_schedule) == period


def test_a_success_never_moves_the_record_back():
    now = timezone.now()
    job_succeeded(name="push-all-leases", task="nodes.push_all_leases", now=now)
    job_succeeded(name="push-all-leases", task="nodes.push_all_leases", now=now - timedelta(minutes=5))
    assert PeriodicJob.objects.get(name="push-all-leases").last_success_at == now


def test_a_job_more_than_three_periods_late_opens_the_alert_and_running_again_resolves_it(clock):
    start = timezone.now()
    assert alerts_check_jobs(now=start) is None  # first look: every job is watched from now
    assert PeriodicJob.objects.count() == len(app.conf.beat_schedule)
    all_ran(start)

    clock.shift(timedelta(minutes=2))  # refresh-status (every 10 s) may be 2 minutes late...
    assert alerts_check_jobs(now=timezone.now()) is None
    clock.shift(timedelta(seconds=1))  # ...not more
    alert = alerts_check_jobs(now=timezone.now())
    assert alert is not None and (alert.node, alert.gpu, alert.username) == (None, None, "")
    assert [job["name"] for job in alert.details["jobs"]] == ["refresh-status"]

    clock.move_to(start + timedelta(minutes=3, seconds=1))  # push-all-leases (every minute): 3 periods
    assert alerts_check_jobs(now=timezone.now()) is None  # the same alert, naming one more job
    alert.refresh_from_db()
    late = {job["name"] for job in alert.details["jobs"]}
    assert {"refresh-status", "push-all-leases", "send-due-mail"} <= late and "prune-usage" not in late  # hourly
    assert alert.last_bad_at == timezone.now() and len(jobs_late()) == 1

    all_ran(timezone.now() - timedelta(seconds=5))
    clock.shift(timedelta(seconds=1))
    assert alerts_check_jobs(now=timezone.now()) is None
    alert.refresh_from_db()
    assert alert.resolved_at == timezone.now() and alert.resolution == "the periodic jobs ran again"


def test_a_fast_job_gets_two_minutes_before_it_is_late(clock):
    refresh = next(state for state in job_states(now=timezone.now()) if state.name == "refresh-status")
    assert refresh.period == timedelta(seconds=10) and refresh.late_after() == LATE_AT_LEAST
    alerts_check_jobs(now=timezone.now())
    all_ran(timezone.now())
    clock.shift(timedelta(seconds=100))  # ten periods of refresh-status: a beat restart, not a death
    alerts_check_jobs(now=timezone.now())
    assert jobs_late() == []


def test_a_job_that_never_ran_is_late_counting_from_when_it_was_first_watched(clock):
    alerts_check_jobs(now=timezone.now())
    clock.shift(timedelta(hours=4))
    alert = alerts_check_jobs(now=timezone.now())
    prune = next(job for job in alert.details["jobs"] if job["name"] == "prune-usage")
    assert prune == {
        "name": "prune-usage",
        "task": "nodes.prune_usage",
        "period_seconds": 3600.0,
        "last_success_at": None,
        "waited_seconds": 4 * 3600,
    }


def test_heartbeats_check_at_most_every_jobs_late_check_seconds(node, clock, settings):
    settings.JOBS_LATE_CHECK_SECONDS = 30
    clock.shift(timedelta(seconds=31))  # whatever this process checked before, it is due now
    heartbeat(node)  # watches the jobs from now
    clock.shift(timedelta(minutes=10))
    heartbeat(node)
    assert len(jobs_late()) == 1
    all_ran(timezone.now())
    clock.shift(timedelta(seconds=29))
    heartbeat(node)  # checked 29 s ago: not again yet
    assert len(jobs_late()) == 1
    clock.shift(timedelta(seconds=1))
    heartbeat(node)
    assert jobs_late() == []


def test_the_late_jobs_are_shown_to_admins_on_the_status_page_and_mailed_to_staff(
    node, clock, check_every_heartbeat, carol, alice, smtp_server
):
    heartbeat(node)
    all_ran(timezone.now())
    clock.shift(timedelta(minutes=12))
    heartbeat(node)

    page = Client()
    page.force_login(carol)
    html = page.get("/status/").content.decode()
    start = html.index('<script id="alerts-data" type="application/json">') + len(
        '<script id="alerts-data" type="application/json">'
    )
    (shown,) = json.loads(html[start : html.index("</script>", start)])
    assert (shown["kind"], shown["node"], shown["gpu"]) == ("jobs_late", None, None)
    assert shown["label"] == "Periodic jobs late"
    assert "send-due-mail (every 60 s): no success for 12 min" in shown["summary"]
    assert "push-all-leases (every 60 s): no success for 12 min" in shown["summary"]

    page.force_login(alice)
    assert "alerts-data" not in page.get("/status/").content.decode()

    assert alerts_mail_staff(now=timezone.now()) == 1
    (mail,) = smtp_server.wait_for(1)
    assert subject_of(mail) == "[GPU alert] Periodic jobs late"
    assert "- Periodic jobs late: the portal" in text_of(mail)
    assert "refresh-status (every 10 s): no success for 12 min" in text_of(mail)
