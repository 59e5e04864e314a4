"""The status page's "Open alerts" panel in Chromium: an admin sees the open alerts and a new one
arrives live (websocket topic "alerts"), a resolved one leaves; a researcher sees no panel."""

from __future__ import annotations

from django.utils import timezone
from playwright.sync_api import expect

from alerts.services import Subject, alert_open
from tests.browser.test_live import open_page
from tests.live.server import heartbeat, post_agent, telemetry


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
