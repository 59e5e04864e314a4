"""A weekly series booked from the calendar's dialog as a person does it: drag a slot, choose Repeat, preview
the per-occurrence report (one occurrence taken by someone else), book skipping that conflict and see the
report after; the series page lists the occurrences and My reservations marks them."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from playwright.sync_api import expect

from reservations.models import Reservation, Series
from reservations.services import reservation_create
from tests.browser.helpers import drag, log_in, open_tomorrow, tomorrow_at

pytestmark = pytest.mark.django_db(transaction=True)


def test_book_a_weekly_series_from_the_dialog_and_see_the_report(page, live_server, alice, bob, gpus, screenshot):
    week = timedelta(days=7)
    reservation_create(user=bob, gpus=[gpus[1]], start=tomorrow_at(10) + week, end=tomorrow_at(12) + week)
    log_in(page, live_server, "alice")
    open_tomorrow(page)

    drag(page, 1, "10:00", "12:00")
    dialog = page.locator("#booking-dialog")
    expect(dialog).to_be_visible()
    dialog.get_by_label("Repeat", exact=True).select_option("weekly")
    dialog.get_by_label("Until (last day)").fill(f"{tomorrow_at(0) + 3 * week:%Y-%m-%d}")
    dialog.get_by_role("button", name="Preview").click()

    report = page.locator("#booking-report")
    expect(report).to_contain_text("Preview: 3 of 4 occurrences can be booked, 1 refused.")
    items = report.locator("li")
    expect(items).to_have_count(4)
    expect(items.nth(1)).to_contain_text(re.compile(r"refused — Slot taken: .* by bob"))
    expect(items.nth(0)).to_contain_text("10:00–12:00: can be booked")
    report.scroll_into_view_if_needed()
    screenshot("series-preview")
    assert not Series.objects.exists()

    dialog.get_by_label("Skip conflicts").check()
    dialog.get_by_role("button", name="Book").click()
    expect(report).to_contain_text("3 of 4 occurrences were booked, 1 refused.")
    expect(report.locator("li.outcome-booked")).to_have_count(3)
    report.scroll_into_view_if_needed()
    screenshot("series-booked")
    series = Series.objects.get(user=alice)
    booked = Reservation.objects.filter(series=series).order_by("start")
    assert [r.start for r in booked] == [tomorrow_at(10), tomorrow_at(10) + 2 * week, tomorrow_at(10) + 3 * week]

    report.get_by_role("link", name=f"Open series #{series.pk}").click()
    table = page.locator("#series-occurrences")
    expect(table.locator("tbody tr")).to_have_count(4)
    expect(table.locator("tbody tr").nth(1)).to_contain_text("Not booked yet")
    screenshot("series-page")
    table.locator("tbody tr").nth(2).get_by_role("button", name="Cancel this and following").click()
    expect(page.locator(".messages")).to_contain_text("2 bookings cancelled")
    assert Reservation.objects.filter(series=series, status=Reservation.Status.APPROVED).count() == 1

    page.goto(f"{live_server.url}/reservations/mine/")
    expect(page.locator(".series-link").first).to_have_text(f"series #{series.pk}")
