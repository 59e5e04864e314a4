"""The dark scheme (static/css/dark.css): with the system set to dark (the browser context's color_scheme), the pages
are dark and dark.css comes last; the light scheme is left as it was. Every page's WCAG 2.1 AA check in both schemes
is in test_accessibility.py (the calendar's in test_calendar_accessibility.py), which also calls assert_dark.
Screenshots: var/screenshots/dark-*.png."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.browser.accessibility import COLOURS, assert_dark, axe_violations, described
from tests.browser.helpers import open_page, open_tomorrow, save_screenshot

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser_context_args(color_scheme="dark")]


def test_the_login_form_is_dark_and_meets_wcag_2_1_aa_and_light_stays_light(asgi_server, page):
    page.goto(f"{asgi_server.url}/accounts/login/")
    save_screenshot(page, "dark-login")
    assert_dark(page)
    assert not (violations := axe_violations(page)), described(violations)

    page.emulate_media(color_scheme="light")
    light = page.evaluate("getComputedStyle(document.documentElement).backgroundColor")
    assert light == "rgb(246, 247, 249)"  # portal.css's --bg, untouched


def test_the_calendar_is_dark(asgi_server, lab_in_every_state, page):
    open_page(page, asgi_server, lab_in_every_state["researcher"], "/")
    expect(page.locator("#calendar")).to_have_attribute("aria-busy", "false")
    assert_dark(page)
    grid = page.evaluate(COLOURS.replace("'.card, .gpu-card, table'", "'.calendar .ec-body .ec-day'"))
    assert grid["card"] < 0.03, f"the calendar's grid is not dark: {grid}"
    save_screenshot(page, "dark-calendar")
    open_tomorrow(page)
    expect(page.locator(".ec-bg-event.reserved", has_text="vision").first).to_be_visible()
    save_screenshot(page, "dark-calendar-tomorrow")
    page.get_by_role("button", name="New booking…").click()
    expect(page.locator("#booking-dialog")).to_be_visible()
    save_screenshot(page, "dark-calendar-dialog")
