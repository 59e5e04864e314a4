"""The calendar opens around now, on a desktop and on a phone: in the evening the day view shows now
at about a third of the visible hours, with the night and the next morning after it, and its first
hour label whole; the week view starts today; "Today" comes back to the same place. On a phone a
GPU's row says "GPU 0" (the full name on hover and on keyboard focus) and the grid shows that it
scrolls sideways. Screenshots: var/screenshots/calendar-evening-*.png.

The evening is the reader's: alice's zone is the one where it is 19:xx now (Etc/GMT-N), so the
server, the browser and the calendar all run on the real clock, served by the real ASGI server.
"""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from django.utils import timezone
from playwright.sync_api import Page, expect

from tests.browser import helpers
from tests.browser.helpers import first_day, save_screenshot
from tests.factories import node_with_gpus

pytestmark = pytest.mark.django_db(transaction=True)

DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}


def evening_zone(hour: int = 19) -> str:
    """A zone where the local time is ``hour``:xx now: "Etc/GMT-5" is UTC+05:00 (the sign is POSIX's)."""
    offset = (hour - timezone.now().astimezone(UTC).hour) % 24
    if offset > 14:  # the zones run from UTC-12 to UTC+14
        offset -= 24
    return f"Etc/GMT{'-' if offset >= 0 else '+'}{abs(offset)}"


def local_now(zone: str) -> datetime:
    return timezone.now().astimezone(ZoneInfo(zone))


@pytest.fixture
def evening(alice, gpus):
    """alice in a zone where it is evening, and a second node so the rows fill the screen."""
    node_with_gpus(8, name="gpu-h100")
    alice.timezone = evening_zone()
    alice.save()
    return alice


def open_calendar(browser, server, user, viewport: dict) -> Page:
    # A browser in another zone than alice's reading one: the calendar follows her setting.
    return helpers.open_calendar(browser, server, user, viewport=viewport, timezone_id="America/New_York")


def layout(page: Page) -> dict:
    """Where the grid shows: the visible part of the timeline (right of the row labels), the now line,
    the hour labels in view, and the scroll position."""
    return page.evaluate(
        """() => {
        const main = document.querySelector('.ec-main');
        const box = main.getBoundingClientRect();
        const sidebar = main.querySelector('.ec-header .ec-sidebar').getBoundingClientRect();
        const now = main.querySelector('.ec-now-indicator');
        const from = sidebar.right, to = box.left + main.clientWidth;
        const labels = [...main.querySelectorAll('.ec-header .ec-slot time')]
            .map((el) => {
                const r = el.getBoundingClientRect();
                const shown = getComputedStyle(el).visibility !== 'hidden';
                // The label text sits a little right of its hour's edge: start is the hour's own edge.
                const start = el.closest('.ec-slot').getBoundingClientRect().left;
                return {text: el.textContent, left: r.left, right: r.right, start, shown};
            })
            .filter((label) => label.right > from && label.left < to);
        return {
            from, to, scrollLeft: main.scrollLeft,
            now: now && !now.classList.contains('ec-hidden') ? now.getBoundingClientRect().left : null,
            labels,
        };
    }"""
    )


def assert_now_at_a_third(grid: dict) -> None:
    assert grid["now"] is not None, "the now line is not in view"
    share = (grid["now"] - grid["from"]) / (grid["to"] - grid["from"])
    assert 0.2 < share < 0.45, f"now is at {share:.0%} of the visible hours"


def assert_first_label_whole(grid: dict) -> None:
    """The first hour in view shows its label whole (the grid opens on an hour's edge), and no label
    shown is cut by an edge."""
    first = grid["labels"][0]
    assert first["shown"], f"the first hour label in view, {first['text']}, is hidden"
    assert first["left"] >= grid["from"] - 0.5, f"the first hour label {first['text']} is cut: {first} {grid['from']}"
    for label in grid["labels"]:
        if label["shown"]:
            assert grid["from"] - 0.5 <= label["left"] and label["right"] <= grid["to"] + 0.5, f"{label} is cut"


@pytest.mark.parametrize("device", ["desktop", "phone"])
def test_in_the_evening_the_day_view_shows_now_at_a_third_and_the_night_after(asgi_server, evening, browser, device):
    viewport = DESKTOP if device == "desktop" else PHONE
    zone = evening.timezone
    now = local_now(zone)
    page = open_calendar(browser, asgi_server, evening, viewport)
    expect(page.locator("#calendar-zone")).to_contain_text(zone)
    expect(first_day(page)).to_have_attribute("datetime", f"{now:%Y-%m-%d}")
    expect(page.locator(".ec-now-indicator")).to_be_visible()
    page.wait_for_timeout(200)  # the placement runs on the frame after drawing

    grid = layout(page)
    assert_now_at_a_third(grid)
    assert_first_label_whole(grid)
    hours = [label["text"] for label in grid["labels"]]
    assert f"{now.hour:02d}:00" in hours
    if viewport is DESKTOP:
        assert "00:00" in hours, f"the night is not in view: {hours}"  # and the next morning after it
        assert "05:00" in hours
    save_screenshot(page, f"calendar-evening-{device}-day")

    # Somewhere else, then "Today": back to the same place.
    page.locator(".ec-main").evaluate("main => { main.scrollLeft = 0; }")
    page.get_by_role("button", name="Next day").click()
    expect(first_day(page)).to_have_attribute("datetime", f"{now + timedelta(days=1):%Y-%m-%d}")
    page.get_by_role("button", name="Today").click()
    expect(first_day(page)).to_have_attribute("datetime", f"{now:%Y-%m-%d}")
    page.wait_for_timeout(200)
    again = layout(page)
    assert abs(again["scrollLeft"] - grid["scrollLeft"]) <= 1
    page.locator(".ec-main").evaluate("main => { main.scrollLeft = 0; }")
    page.get_by_role("button", name="Today").click()  # while today is already shown
    page.wait_for_timeout(200)
    assert abs(layout(page)["scrollLeft"] - grid["scrollLeft"]) <= 1

    page.get_by_role("button", name="Week", exact=True).click()
    expect(first_day(page)).to_have_attribute("datetime", f"{now:%Y-%m-%d}")  # not last Monday
    expect(page.locator(".ec-now-indicator")).to_be_visible()
    page.wait_for_timeout(200)
    week = layout(page)
    assert week["from"] <= week["now"] <= week["to"]
    assert_first_label_whole(week)
    save_screenshot(page, f"calendar-evening-{device}-week")
    page.context.close()


@pytest.mark.parametrize("zone", ["UTC", "Etc/GMT-0", "Europe/London"])
def test_in_a_zone_at_utc_the_calendar_shows_that_zone_s_today_and_now_not_the_browser_s(
    asgi_server, alice, gpus, browser, zone
):
    """EventCalendar 5.10.1 took an offset of zero for "the browser's own" when it read the clock, so at
    UTC+00:00 the now line and "today" followed the browser (here New York, five hours behind). The
    vendored bundle is patched (static/vendor/README.md); this fails without the patch."""
    if local_now(zone).utcoffset():
        pytest.skip(f"{zone} is not at UTC+00:00 today")
    alice.timezone = zone
    alice.save()
    before = local_now(zone)
    page = open_calendar(browser, asgi_server, alice, DESKTOP)
    expect(page.locator("#calendar-zone")).to_contain_text("UTC+00:00")
    expect(first_day(page)).to_have_attribute("datetime", f"{before:%Y-%m-%d}")
    expect(page.locator(".ec-now-indicator")).to_be_visible()
    page.wait_for_timeout(200)
    grid = layout(page)
    after = local_now(zone)
    # Not "at a third": just after midnight nothing of the day lies before now (the evening test covers that).
    assert grid["now"] is not None, "the now line is not in view"
    # The hour labels count from the zone's midnight; the now line is in the hour of the clock (either
    # side of the test's reading of it, in case an hour turned meanwhile; a pixel either side for
    # rounding on an hour's edge).
    hours = {f"{before.hour:02d}:00", f"{after.hour:02d}:00"}
    inside = {
        label["text"]
        for label, following in itertools.pairwise(grid["labels"])
        if label["start"] - 1 <= grid["now"] <= following["start"] + 1
    }
    assert inside & hours, f"the now line is in {sorted(inside) or 'no'} hour, not {sorted(hours)}: {grid}"
    page.context.close()


def test_on_a_phone_gpu_rows_are_short_with_the_full_name_on_focus_and_the_grid_says_it_scrolls(
    asgi_server, evening, browser
):
    page = open_calendar(browser, asgi_server, evening, PHONE)
    label = page.locator(".row-label[data-full]").first
    full = "GPU 0 · A100-SXM4 80 GB"
    expect(label).to_have_attribute("title", full)
    expect(label.locator(".row-short")).to_have_text("GPU 0")
    assert label.bounding_box()["width"] < 60  # "GPU 0", not the model
    # Screen readers still hear the whole name.
    assert (
        "- text: gpu-a100 GPU 0 · A100-SXM4 80 GB GPU 1 · A100-SXM4 80 GB"
        in page.locator(".ec-sidebar").last.aria_snapshot()
    )
    sidebar = page.locator(".ec-header .ec-sidebar").bounding_box()["width"]
    assert sidebar < 130, f"the row labels take {sidebar}px of 390"

    # Keyboard: from the node's expander, Tab reaches GPU 0's label, which shows the full name.
    page.get_by_role("button", name="Collapse").first.focus()
    page.keyboard.press("Tab")
    expect(label).to_be_focused()
    tip = page.locator("#row-tip")
    expect(tip).to_be_visible()
    expect(tip).to_have_text(full)
    save_screenshot(page, "calendar-evening-phone-focused-row")
    page.keyboard.press("Tab")
    expect(tip).to_have_text("GPU 1 · A100-SXM4 80 GB")  # the next row's
    page.keyboard.press("Shift+Tab")
    page.keyboard.press("Shift+Tab")
    expect(page.get_by_role("button", name="Collapse").first).to_be_focused()
    expect(tip).to_be_hidden()

    # The grid shows it scrolls: shadows on both edges, and a hint until it has been scrolled.
    frame = page.locator("#calendar-frame")
    expect(frame).to_have_class("calendar-frame more-before more-after")
    hint = page.locator("#scroll-hint")
    expect(hint).to_be_visible()
    box = page.locator(".ec-main").bounding_box()
    page.mouse.move(box["x"] + box["width"] - 40, box["y"] + 60)
    page.mouse.wheel(300, 0)
    expect(hint).to_be_hidden()
    page.reload()
    expect(page.locator("#calendar")).to_have_attribute("aria-busy", "false")
    expect(hint).to_be_hidden()  # once learnt, not shown again
    page.context.close()


def test_on_a_desktop_rows_keep_their_full_names_and_are_no_tab_stops(asgi_server, evening, browser):
    page = open_calendar(browser, asgi_server, evening, DESKTOP)
    label = page.locator(".row-label[data-full]").first
    expect(label).to_have_text("GPU 0 · A100-SXM4 80 GB")
    expect(label).not_to_have_attribute("tabindex", "0")
    expect(page.locator("#scroll-hint")).to_be_hidden()
    page.context.close()


def test_scrolled_by_hand_no_hour_label_shows_cut(asgi_server, evening, browser):
    page = open_calendar(browser, asgi_server, evening, DESKTOP)
    for step in (30, 20, 41, 7, 300):  # pixels: onto every part of an hour's column
        page.locator(".ec-main").evaluate(f"main => {{ main.scrollLeft += {step}; }}")
        page.wait_for_timeout(100)
        grid = layout(page)
        shown = [label for label in grid["labels"] if label["shown"]]
        assert shown, grid
        for label in shown:
            assert grid["from"] - 0.5 <= label["left"] and label["right"] <= grid["to"] + 0.5, f"{label} is cut"
    page.context.close()
