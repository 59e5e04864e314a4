"""A booking's own page, reached the way a person reaches it: from the booking's dialog in the
calendar ("Details"), which only its holder and the admins are offered."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from accounting.rollup import rollup
from nodes.ingest import telemetry_record
from reservations.models import Reservation
from tests.browser.helpers import Problems, log_in, save_screenshot
from tests.factories import book

pytestmark = pytest.mark.django_db(transaction=True)


def running_with_usage(user, node, gpus, purpose: str) -> Reservation:
    """A booking made through the service (so its history is real) that is then moved to have begun
    40 minutes ago (the rules forbid booking the past), with 40 minutes of readings rolled up:
    GPU 0 busy at 300 W, GPU 1 busy half the time at 100 W (their energy counters)."""
    now = timezone.now().replace(second=0, microsecond=0)
    booking = book(user, gpus, now, now + timedelta(hours=3), purpose=purpose)
    began = now - timedelta(minutes=40)
    Reservation.objects.filter(pk=booking.pk).update(start=began)
    booking.allocations.update(start=began)
    for minute in range(40):
        samples = [
            {
                "uuid": gpu.uuid,
                "utilization_pct": 85 if i == 0 or minute % 2 else 0,
                "memory_used_mib": 61440 if i == 0 else 8192,
                "processes": [],
                "energy_mj": (18_000_000 if i == 0 else 6_000_000) * minute,
            }
            for i, gpu in enumerate(gpus)
        ]
        telemetry_record(node=node, samples=samples, now=began + timedelta(minutes=minute, seconds=5))
    rollup(since=began, until=now + timedelta(minutes=1))
    booking.refresh_from_db()
    return booking


def test_the_dialogs_details_link_opens_the_bookings_page(
    browser, page, live_server, alice, bob, node, gpus, screenshot
):
    booking = running_with_usage(alice, node, gpus[:2], purpose="fine-tuning a 7B model")
    problems = Problems(page, requests=False)
    log_in(page, live_server, "alice")

    page.locator(f'.ec-event[data-reservation-id="{booking.pk}"]').first.click()
    dialog = page.locator("#reservation-dialog")
    details = dialog.get_by_role("link", name="Details")
    expect(details).to_be_visible()
    screenshot("dialog")
    # The calendar's live updates have no websocket under live_server (it retries): only the booking page counts,
    # from the moment it replaces the calendar, whenever the calendar's last retry was.
    page.on("framenavigated", lambda frame: problems.take() if frame == page.main_frame else None)
    details.click()

    page.wait_for_url(f"{live_server.url}/reservations/{booking.pk}/")
    expect(page.get_by_role("heading", level=1)).to_contain_text(f"Booking #{booking.pk}")
    expect(page.locator("#access")).to_contain_text(f"ssh alice@{node.hostname}")
    expect(page.locator("#access")).to_contain_text(f"export CUDA_VISIBLE_DEVICES={gpus[0].uuid},{gpus[1].uuid}")
    expect(page.locator("#usage")).to_contain_text(re.compile(r"of 1\.3\d GPU-hours booked so far"))
    expect(page.locator("#usage")).to_contain_text("0.260 kWh")  # 39 minutes between readings at 300 W + 100 W
    expect(page.locator("#history")).to_contain_text("Booked")
    expect(page.locator("#actions").get_by_role("button", name="Release now")).to_be_visible()
    screenshot("page")
    assert problems.take() == []

    # On a phone: one column, nothing wider than the screen.
    phone = browser.new_page(viewport={"width": 390, "height": 844}, timezone_id="Europe/Berlin")
    log_in(phone, live_server, "alice")
    phone.goto(f"{live_server.url}/reservations/{booking.pk}/")
    assert phone.evaluate("document.documentElement.scrollWidth") <= 390
    save_screenshot(phone, "test_the_dialogs_details_link_opens_the_bookings_page-phone")
    phone.close()

    # Another researcher sees the booking in the calendar, but is offered no page: it is not theirs.
    other = browser.new_page()
    log_in(other, live_server, "bob")
    other.locator(f'.run-blocks .block[data-reservation-id="{booking.pk}"]').first.click()
    expect(other.locator("#reservation-dialog").get_by_role("heading")).to_have_text("Booked by alice")
    expect(other.locator("#reservation-page")).to_be_hidden()
    assert other.goto(f"{live_server.url}/reservations/{booking.pk}/").status == 404
    other.close()


def test_an_action_on_the_page_comes_back_to_it(page, live_server, alice, node, gpus, screenshot):
    booking = running_with_usage(alice, node, gpus[:1], purpose="")
    log_in(page, live_server, "alice")
    page.goto(f"{live_server.url}/reservations/{booking.pk}/")

    page.locator("#actions").get_by_role("button", name="Extend").click()

    expect(page.locator(".messages")).to_contain_text(f"Reservation #{booking.pk} extended")
    assert page.url == f"{live_server.url}/reservations/{booking.pk}/"
    expect(page.locator("#history")).to_contain_text("Extended by alice")
    screenshot("extended")
