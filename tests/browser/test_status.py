"""The status page with a busy GPU, on a desktop and on a phone: the card shows the holder, the load
the agent reported and its sparkline, and nothing on the page is wider than the screen.
Screenshots: var/screenshots/status-busy-*.png."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from nodes.history import history_record
from tests.browser.helpers import give_session, save_screenshot
from tests.factories import book
from tests.live.server import heartbeat, post_agent, telemetry

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize("device", ["desktop", "phone"])
def test_a_busy_gpu_shows_its_holder_load_and_history(asgi_server, live_lab, browser, device):
    researcher, gpus = live_lab["researcher"], live_lab["gpus"]
    now = timezone.now()
    book(researcher, gpus[:1], now - timedelta(minutes=30), now + timedelta(hours=2), purpose="training", direct=True)
    post_agent(asgi_server, live_lab, "heartbeat", heartbeat()).raise_for_status()
    # The last nine minutes, as the agent's earlier reports would have left them: busy, a pause, busy.
    history_record(
        (gpu.pk, now - timedelta(seconds=seconds), load if gpu == gpus[0] else 0)
        for seconds in range(540, 0, -15)
        for gpu in gpus
        for load in [0 if 300 < seconds < 380 else 55 + (seconds // 15 * 13) % 40]
    )
    idle = telemetry(utilization=0, uuid="GPU-live-1")
    idle["gpus"][0].update(memory_used_mib=0, power_w=61.0, power_limit_w=100.0, temperature_c=31, processes=[])
    for load in (80, 77):
        busy = telemetry(utilization=load)
        busy["gpus"] += idle["gpus"]
        post_agent(asgi_server, live_lab, "telemetry", busy).raise_for_status()

    viewport = {"width": 1280, "height": 800} if device == "desktop" else {"width": 390, "height": 844}
    context = browser.new_context(viewport=viewport)
    give_session(context, asgi_server, researcher)
    page = context.new_page()
    page.goto(f"{asgi_server.url}/status/")
    expect(page.locator("#live-state")).to_have_text("Live")

    card = page.locator(f'.gpu-card[data-gpu="{gpus[0].pk}"]')
    expect(card.locator('[data-metric="utilization"] .metric-value')).to_have_text("77 %")
    expect(card.locator('[data-role="state"]')).to_have_text("In use")
    expect(card.locator('[data-role="holder"]')).to_contain_text("Held by rita until")
    expect(card.locator(".processes")).to_contain_text("rita · 3.9 GB")
    other = page.locator(f'.gpu-card[data-gpu="{gpus[1].pk}"]')
    expect(other.locator('[data-metric="utilization"] .metric-value')).to_have_text("0 %")
    expect(other.locator('[data-metric="power"] .metric-value')).to_have_text("61 W of 100 W")  # the idle cap's limit

    # Nothing overflows sideways, on the phone either.
    assert page.evaluate("document.documentElement.scrollWidth") <= viewport["width"]
    save_screenshot(page, f"status-busy-{device}")
    context.close()
