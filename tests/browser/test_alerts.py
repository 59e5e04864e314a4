"""The status page's "Open alerts" panel in Chromium: an admin sees the open alerts and a new one
arrives live (websocket topic "alerts"), a resolved one leaves; a researcher sees no panel. Periodic
jobs late (an alert about the portal, with no node) arrive and leave the same way, and a node's
agent line says how many events it sent past its budget."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone
from playwright.sync_api import expect

from alerts.jobs import job_succeeded
from alerts.models import Alert, PeriodicJob
from alerts.records import Subject, alert_open
from portal.celery import app
from tests.browser.helpers import open_page
from tests.live.server import AsgiServer, heartbeat, post_agent, telemetry


def hot(uuid: str, temperature: int) -> dict:
    body = telemetry(utilization=93, uuid=uuid)
    body["gpus"][0] |= {"temperature_c": temperature, "slowdown_temperature_c": 90}
    return body


def test_admins_see_open_alerts_live_and_researchers_see_none(asgi_server, live_lab, page, screenshot):
    lab, node = live_lab, live_lab["node"]
    post_agent(asgi_server, lab, "heartbeat", heartbeat()).raise_for_status()
    for _ in range(2):
        post_agent(asgi_server, lab, "telemetry", hot("GPU-live-0", 91)).raise_for_status()
    alert_open(
        subject=Subject("offline", node.pk),
        now=timezone.now(),
        details={"last_seen": timezone.now().isoformat()},
    )

    open_page(page, asgi_server, lab["admin"])
    expect(page.locator("#live-state")).to_have_text("Live")
    panel = page.locator("section.alerts")
    expect(panel.locator("#alerts-count")).to_have_text("2")
    expect(panel.locator(".alert-temperature")).to_contain_text("live-a100 GPU 0")
    expect(panel.locator(".alert-temperature")).to_contain_text("91 °C (alert at 85 °C, slowdown at 90 °C)")

    violation = {"kind": "violation", "at": timezone.now().isoformat(), "gpu": "GPU-live-1", "user": "mallory"}
    post_agent(asgi_server, lab, "events", {"events": [violation]}).raise_for_status()
    expect(panel.locator(".alert-violation")).to_contain_text("live-a100 GPU 1 · mallory")  # no reload
    expect(panel.locator("#alerts-count")).to_have_text("3")
    screenshot("admin")

    post_agent(asgi_server, lab, "telemetry", hot("GPU-live-0", 60)).raise_for_status()
    expect(panel.locator(".alert-temperature")).to_have_count(0)
    expect(panel.locator("#alerts-count")).to_have_text("2")

    page.context.clear_cookies()
    open_page(page, asgi_server, lab["researcher"])
    expect(page.locator("#live-state")).to_have_text("Live")
    expect(page.locator("section.alerts")).to_have_count(0)


@pytest.fixture
def server_checking_jobs(transactional_db):
    """daphne as ``asgi_server``, checking the periodic jobs at every heartbeat (not every 30 s), and
    storing at most 2 agent events a minute."""
    if connection.vendor != "postgresql":
        pytest.skip("the ASGI server subprocess shares the test database: PostgreSQL only")
    server = AsgiServer(LIVE_RECHECK_SECONDS="1", JOBS_LATE_CHECK_SECONDS="0", NODE_EVENTS_PER_MINUTE="2")
    server.start()
    yield server
    server.stop()


def test_admins_see_periodic_jobs_late_arrive_and_leave_and_the_events_an_agent_sent_past_its_budget(
    server_checking_jobs, live_lab, page, screenshot
):
    server, lab = server_checking_jobs, live_lab
    revoked = {"kind": "revoked", "at": timezone.now().isoformat(), "gpu": "GPU-live-0", "user": "rita"}
    post_agent(server, lab, "events", {"events": [revoked] * 5}).raise_for_status()
    # Beat died twenty minutes ago: every job's last success is that old.
    long_ago = timezone.now() - timedelta(minutes=20)
    for name, entry in app.conf.beat_schedule.items():
        job_succeeded(name=name, task=entry["task"], now=long_ago)

    open_page(page, server, lab["admin"])
    expect(page.locator("#live-state")).to_have_text("Live")
    panel = page.locator("section.alerts")
    expect(panel.locator("#alerts-count")).to_have_text("0")
    node = page.locator('section.node[data-node="live-a100"]')
    expect(node.locator('[data-role="events-dropped"]')).to_contain_text(
        "3 events over the per-minute budget were counted, not stored"
    )

    post_agent(server, lab, "heartbeat", heartbeat()).raise_for_status()  # an agent report checks the jobs
    late = panel.locator(".alert-jobs_late")
    expect(late).to_contain_text("Periodic jobs late")  # no reload: the "alerts" topic
    expect(late.locator(".alert-where")).to_have_text("The portal")
    expect(late.locator(".alert-summary")).to_contain_text("push-all-leases (every 60 s): no success for 20 min")
    screenshot("jobs-late")

    for name, entry in app.conf.beat_schedule.items():  # beat is back: every job ran
        job_succeeded(name=name, task=entry["task"], now=timezone.now())
    post_agent(server, lab, "heartbeat", heartbeat()).raise_for_status()
    expect(late).to_have_count(0)
    expect(panel.locator("#alerts-count")).to_have_text("0")

    page.context.clear_cookies()
    PeriodicJob.objects.update(last_success_at=long_ago)  # beat dies again: researchers see nothing of it
    post_agent(server, lab, "heartbeat", heartbeat()).raise_for_status()
    assert Alert.objects.filter(kind="jobs_late", resolved_at__isnull=True).exists()
    open_page(page, server, lab["researcher"])
    expect(page.locator("#live-state")).to_have_text("Live")
    expect(page.locator("section.alerts")).to_have_count(0)
    expect(page.get_by_text("Periodic jobs late")).to_have_count(0)
    expect(page.locator('[data-role="events-dropped"]')).to_have_count(0)
