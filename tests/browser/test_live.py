"""Live updates in Chromium, served by the real ASGI server (daphne, websockets): the status page's
values change as telemetry arrives, and after a server restart it says it is reconnecting, then
comes back live by itself; the calendar shows another person's booking, and its cancellation,
without a reload."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone
from playwright.sync_api import expect

from live.status import refresh_status
from nodes.models import AgentState
from reservations.services import reservation_cancel, reservation_create
from tests.browser.helpers import block, open_page, open_tomorrow, tomorrow_at
from tests.factories import book
from tests.live.server import heartbeat, post_agent, telemetry


def test_the_status_page_follows_telemetry_and_reconnects_after_a_restart(asgi_server, live_lab, page, screenshot):
    now = timezone.now()
    researcher, gpu = live_lab["researcher"], live_lab["gpus"][0]
    book(researcher, [gpu], now - timedelta(minutes=30), now + timedelta(hours=2), purpose="training", direct=True)
    post_agent(asgi_server, live_lab, "heartbeat", heartbeat()).raise_for_status()
    post_agent(asgi_server, live_lab, "telemetry", telemetry(utilization=10)).raise_for_status()

    open_page(page, asgi_server, live_lab["researcher"])
    state = page.locator("#live-state")
    expect(state).to_have_text("Live")
    card = page.locator(f'.gpu-card[data-gpu="{live_lab["gpus"][0].pk}"]')
    utilisation = card.locator('[data-metric="utilization"] .metric-value')
    expect(utilisation).to_have_text("10 %")
    expect(card.locator('[data-role="holder"]')).to_contain_text("Held by rita until")
    expect(card.locator('[data-role="state"]')).to_have_text("In use")

    post_agent(asgi_server, live_lab, "telemetry", telemetry(utilization=77)).raise_for_status()
    expect(utilisation).to_have_text("77 %")  # no reload
    expect(card.locator(".processes")).to_contain_text("rita · 3.9 GB")
    expect(card.locator(".processes")).not_to_contain_text("pid")  # researchers see no process ids
    screenshot("live")

    asgi_server.stop()
    expect(state).to_have_attribute("data-state", "reconnecting")
    expect(state).to_contain_text("Reconnecting")
    screenshot("reconnecting")

    asgi_server.start()  # same port
    expect(state).to_have_text("Live", timeout=40_000)
    post_agent(asgi_server, live_lab, "telemetry", telemetry(utilization=55)).raise_for_status()
    expect(utilisation).to_have_text("55 %")


def test_an_admin_sees_agent_events_arrive_and_a_gpu_that_went_offline(asgi_server, live_lab, page, screenshot):
    post_agent(asgi_server, live_lab, "heartbeat", heartbeat()).raise_for_status()
    open_page(page, asgi_server, live_lab["admin"])
    expect(page.locator("#live-state")).to_have_text("Live")
    event = {"kind": "violation", "at": timezone.now().isoformat(), "gpu": "GPU-live-1", "user": "mallory"}
    post_agent(asgi_server, live_lab, "events", {"events": [event]}).raise_for_status()
    expect(page.locator("#events li").first).to_contain_text("live-a100 GPU 1: Use without a booking (mallory)")

    AgentState.objects.filter(node=live_lab["node"]).update(last_seen=timezone.now() - timedelta(minutes=5))
    refresh_status()  # what beat runs every STATUS_REFRESH_SECONDS
    section = page.locator('section.node[data-node="live-a100"]')
    expect(section.locator('[data-role="online"]')).to_have_text("Offline")
    expect(section.locator('[data-role="state"]').first).to_have_text("Offline")
    screenshot("offline")


def test_the_calendar_shows_another_persons_booking_and_its_cancellation_without_a_reload(
    asgi_server, live_lab, page, screenshot
):
    researcher, admin, gpus = live_lab["researcher"], live_lab["admin"], live_lab["gpus"]
    open_page(page, asgi_server, researcher, "/")
    open_tomorrow(page)
    expect(page.locator("#live-state")).to_have_text("Live")
    page.evaluate("window.loadedOnce = true")  # gone if the page reloaded

    booking = reservation_create(user=admin, gpus=[gpus[1]], start=tomorrow_at(10), end=tomorrow_at(12))
    expect(block(page, booking)).to_have_text("10:00 adam")
    screenshot("booked-elsewhere")

    reservation_cancel(reservation=booking, actor=admin)
    expect(block(page, booking)).to_have_count(0)
    assert page.evaluate("window.loadedOnce") is True
