"""The person-to-account binding and extensions that need approval, as people do them in Chromium."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from playwright.sync_api import expect

from accounts.models import User
from reservations.models import Reservation
from reservations.services import reservation_create
from tests.browser.helpers import log_in, save_screenshot
from tests.factories import UserFactory


def test_a_requested_unix_username_waits_for_an_admin_who_confirms_it(page, browser, live_server, carol, screenshot):
    UserFactory(username="dana", unix_username=None)
    log_in(page, live_server, "dana")
    page.goto(f"{live_server.url}/profile/")
    expect(page.get_by_text("None yet: request one")).to_be_visible()
    page.get_by_label("Unix username").fill("dana_lab")
    page.get_by_role("button", name="Save settings").click()

    expect(page.get_by_text("unix username dana_lab requested")).to_be_visible()
    expect(page.get_by_text("waits for an admin's confirmation")).to_be_visible()
    screenshot("researcher-requested")
    assert User.objects.get(username="dana").unix_username is None  # nothing granted yet

    admin = browser.new_page()
    log_in(admin, live_server, "carol")
    admin.get_by_role("link", name="Approvals").click()
    section = admin.get_by_role("region", name="Unix usernames to confirm")
    expect(section).to_contain_text("dana_lab")
    save_screenshot(admin, "test_a_requested_unix_username_waits_for_an_admin-admin-asked")
    admin.get_by_role("button", name="Confirm dana_lab for dana").click()

    expect(admin.get_by_text("dana's unix username is now dana_lab")).to_be_visible()
    expect(admin.get_by_text("No unix username waits for confirmation.")).to_be_visible()
    save_screenshot(admin, "test_a_requested_unix_username_waits_for_an_admin-admin-confirmed")
    assert User.objects.get(username="dana").unix_username == "dana_lab"

    page.reload()
    expect(page.get_by_text("Confirmed: your GPUs open for dana_lab.")).to_be_visible()


def test_an_extension_on_an_approval_node_waits_and_the_page_says_so(page, live_server, alice, carol, gpus, screenshot):
    node = gpus[0].node
    node.requires_approval = True
    node.save()
    now = datetime.now(UTC)
    start = now.replace(minute=now.minute - now.minute % 15, second=0, microsecond=0) + timedelta(days=1)
    booking = reservation_create(user=alice, gpus=gpus[:1], start=start, end=start + timedelta(hours=1), actor=carol)
    log_in(page, live_server, "alice")
    page.goto(f"{live_server.url}/reservations/mine/")

    row = page.locator(f"#reservation-{booking.pk}")
    row.get_by_text("Extend…").click()
    row.get_by_label("Add").select_option("4")
    row.get_by_role("button", name="Extend", exact=True).click()

    expect(page.get_by_text(f"Extension of reservation #{booking.pk} until")).to_be_visible()
    waiting = Reservation.objects.get(extends=booking)
    expect(page.locator(f"#reservation-{waiting.pk}")).to_contain_text("extension: pending approval")
    expect(page.locator(f"#reservation-{booking.pk}")).to_contain_text(f"waits for approval (#{waiting.pk})")
    screenshot("extension-waiting")
    booking.refresh_from_db()
    assert booking.end == start + timedelta(hours=1)
