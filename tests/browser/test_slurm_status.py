"""A Slurm-managed node on the status page and the calendar (issue 23, docs/slurm.md): Slurm's own state and reason
where an agent's node shows its last report, a drained node in maintenance, and nothing called offline for want of
an agent. Screenshots: var/screenshots/status-slurm-*.png, calendar-slurm.png."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from slurm.services import slurm_nodes_import
from tests.browser.helpers import give_session, save_screenshot
from tests.slurm.test_scontrol import NODE, RecordedScontrol

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize("device", ["desktop", "phone"])
def test_a_drained_slurm_node_shows_slurms_words(asgi_server, live_lab, browser, device):
    slurm_nodes_import(controller=RecordedScontrol(NODE))  # "vm": IDLE+DRAIN, fan failure
    viewport = {"width": 1280, "height": 800} if device == "desktop" else {"width": 390, "height": 844}
    context = browser.new_context(viewport=viewport)
    give_session(context, asgi_server, live_lab["researcher"])
    page = context.new_page()
    page.goto(f"{asgi_server.url}/status/")
    expect(page.locator("#live-state")).to_have_text("Live")

    section = page.locator('section.node[data-node="vm"]')
    expect(section.locator('[data-role="online"]')).to_have_text("Slurm")
    expect(section.locator(".manager-state")).to_have_text("Slurm: IDLE+DRAIN: fan failure [root@2026-12-06T06:50:52]")
    expect(section.locator(".badge-maintenance")).to_have_text("In maintenance")
    expect(section).not_to_have_class(re.compile(r"\bnode-offline\b"))
    expect(section.locator(".last-seen")).to_have_count(0)  # no agent to have reported
    expect(section.locator(".gpu-card .model").first).to_have_text("Slurm GPU (a100)")  # counted, not measured
    expect(section.locator(".gpu-card").first).to_contain_text("No readings from Slurm.")
    assert page.evaluate("document.documentElement.scrollWidth") <= viewport["width"]
    save_screenshot(page, f"status-slurm-{device}")

    if device == "desktop":
        page.goto(f"{asgi_server.url}/")
        expect(page.get_by_text("vm (in maintenance: IDLE+DRAIN: fan failure", exact=False)).to_be_visible()
        expect(page.get_by_text("GPU 0 · Slurm GPU (a100)", exact=True)).to_be_visible()
        save_screenshot(page, "calendar-slurm")
    context.close()
