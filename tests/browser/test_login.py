"""Logging in and out in a real browser."""

from __future__ import annotations

import re

from playwright.sync_api import expect

from tests.browser.helpers import log_in


def test_a_researcher_logs_in_lands_on_the_calendar_and_logs_out(page, live_server, alice, screenshot):
    page.goto(f"{live_server.url}/")
    expect(page).to_have_url(f"{live_server.url}/accounts/login/?next=/")
    screenshot("login")

    log_in(page, live_server, "alice")
    expect(page.get_by_role("navigation", name="Main")).to_contain_text("My reservations")
    expect(page.get_by_role("link", name="Approvals")).to_have_count(0)  # not an admin
    screenshot("calendar")

    page.get_by_role("button", name="Log out").click()
    expect(page).to_have_url(f"{live_server.url}/accounts/login/")
    page.goto(f"{live_server.url}/reservations/mine/")
    expect(page).to_have_url(f"{live_server.url}/accounts/login/?next=/reservations/mine/")


def test_a_wrong_password_says_so_and_logs_nobody_in(page, live_server, alice):
    log_in_page = f"{live_server.url}/accounts/login/"
    page.goto(log_in_page)
    page.get_by_label("Username").fill("alice")
    page.get_by_label("Password").fill("not it")
    page.get_by_role("button", name="Log in").click()

    expect(page.get_by_role("alert")).to_contain_text("do not match")
    expect(page).to_have_url(log_in_page)


def test_an_admin_sees_the_approvals_and_admin_links(page, live_server, carol):
    log_in(page, live_server, "carol")
    expect(page.get_by_role("link", name="Approvals")).to_be_visible()
    expect(page.get_by_role("link", name="Admin")).to_be_visible()


def test_after_five_wrong_passwords_the_right_one_is_refused_and_the_page_says_when_to_retry(
    page, live_server, alice, screenshot
):
    log_in_page = f"{live_server.url}/accounts/login/"
    page.goto(log_in_page)
    for attempt in range(1, 6):
        page.get_by_label("Username").fill("alice")
        page.get_by_label("Password").fill(f"guess {attempt}")
        page.get_by_role("button", name="Log in").click()
        expected = "do not match" if attempt < 5 else "Too many failed logins"
        expect(page.get_by_role("alert")).to_contain_text(expected)

    page.get_by_label("Password").fill("correct horse battery staple")
    page.get_by_role("button", name="Log in").click()

    alert = page.get_by_role("alert")
    expect(alert).to_contain_text("Too many failed logins for this username or from your address.")
    expect(alert).to_contain_text(re.compile(r"Try again in 15 minutes, at \d\d:\d\d UTC, or ask an administrator"))
    expect(page).to_have_url(log_in_page)
    screenshot("locked-out")
    page.goto(f"{live_server.url}/reservations/mine/")
    expect(page).to_have_url(f"{live_server.url}/accounts/login/?next=/reservations/mine/")  # nobody logged in
