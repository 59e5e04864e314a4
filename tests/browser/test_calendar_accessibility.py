"""The calendar for keyboard and screen reader users (issue 24).

axe-core finds no WCAG 2.1 A/AA violation, in the light and the dark scheme, for a researcher and an admin: the day
and week views with bookings of every kind, the slot cursor on the grid, the booking dialog open, a refusal shown in
it, and a booking's dialog. A researcher books a GPU, extends and cancels the booking with the keyboard alone (no
mouse event reaches the page), hearing what lies under the slot cursor as it moves; the dialogs keep the focus inside
while open and give it back when they close. Others' changes are said politely, on the calendar and on the status
page, and readings never are. Screenshots: var/screenshots/calendar-a11y-*.png, {calendar,status}-{desktop,phone,
zoom200}.png."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.utils import timezone
from playwright.sync_api import Page, expect

from alerts.models import Alert
from alerts.records import Subject, alert_open
from nodes.services import gpu_drain
from reservations.models import MaintenanceWindow, Reservation, ReservedCapacity
from reservations.services import reservation_create
from tests.browser.accessibility import axe_violations, described
from tests.browser.helpers import give_session, open_calendar, open_tomorrow, save_screenshot, tomorrow_at
from tests.factories import book, node_with_gpus
from tests.live.server import heartbeat, post_agent, telemetry

pytestmark = pytest.mark.django_db(transaction=True)

# Counts what a mouse (or a touch) would send: the keyboard test must end with none.
COUNT_POINTER_EVENTS = """
window.pointerEvents = 0;
for (const type of ['pointerdown', 'pointerup', 'mousedown', 'mouseup', 'touchstart']) {
  window.addEventListener(type, () => { window.pointerEvents += 1; }, true);
}
"""


@pytest.fixture
def lab(live_lab):
    """live-a100 (2 GPUs) and gpu-h100 (4 GPUs) with bookings of every kind tomorrow and now: rita's own
    (an event), someone else's (a block), a pending one, maintenance, and capacity reserved for a group."""
    rita, adam, gpus = live_lab["researcher"], live_lab["admin"], live_lab["gpus"]
    h100 = node_with_gpus(4, name="gpu-h100")
    now = timezone.now()
    book(rita, [gpus[0]], now - timedelta(minutes=30), now + timedelta(hours=2), direct=True)
    book(rita, [gpus[0]], tomorrow_at(8), tomorrow_at(9), purpose="thesis")
    book(adam, [gpus[1]], tomorrow_at(10), tomorrow_at(12))
    h100_gpus = list(h100.gpus.order_by("index"))
    book(adam, [h100_gpus[0]], tomorrow_at(9), tomorrow_at(11), pending=True, direct=True)
    MaintenanceWindow.objects.create(
        node=h100, gpu=h100_gpus[1], start=tomorrow_at(6), end=tomorrow_at(9), reason="new PSU"
    )
    vision = Group.objects.create(name="vision")
    ReservedCapacity.objects.create(group=vision, node=h100, count=2, start=tomorrow_at(14), end=tomorrow_at(18))
    return {**live_lab, "h100": h100}


def assert_no_violations(page: Page, where: str, found: list[str]) -> None:
    if violations := axe_violations(page):
        found.append(f"{where}:\n{described(violations)}")


@pytest.mark.parametrize("scheme", ["light", "dark"])
@pytest.mark.parametrize("who", ["researcher", "admin"])
def test_the_calendar_meets_wcag_2_1_aa_in_every_state(asgi_server, lab, browser, who, scheme):
    page = open_calendar(browser, asgi_server, lab[who], color_scheme=scheme)
    found: list[str] = []
    assert_no_violations(page, "today, day view", found)
    open_tomorrow(page)
    adams = page.locator(".run-blocks .block, .ec-event.booking", has_text="adam")  # an admin's own are events
    expect(adams.first).to_be_visible()
    assert_no_violations(page, "tomorrow, day view with bookings", found)
    save_screenshot(page, f"calendar-a11y-{who}-{scheme}-day")

    page.locator("#slot-cursor").focus()
    expect(page.locator("#slot-cursor")).to_have_class(re.compile(r"\bplaced\b"))
    assert_no_violations(page, "the slot cursor on the grid", found)

    page.get_by_role("button", name="New booking…").click()
    expect(page.locator("#booking-dialog")).to_be_visible()
    assert_no_violations(page, "the booking dialog", found)
    dialog = page.locator("#booking-dialog")
    dialog.get_by_label("Node").select_option("live-a100")
    dialog.get_by_label("GPU 1 · ", exact=False).check()
    dialog.get_by_label("Start").fill(f"{tomorrow_at(11):%Y-%m-%dT%H:%M}")
    dialog.get_by_label("End").fill(f"{tomorrow_at(13):%Y-%m-%dT%H:%M}")
    dialog.get_by_role("button", name="Book").click()
    expect(dialog.locator("#booking-error")).to_contain_text("Join the waitlist")
    assert_no_violations(page, "a refusal in the booking dialog", found)
    save_screenshot(page, f"calendar-a11y-{who}-{scheme}-refused")
    dialog.get_by_role("button", name="Close").click()

    adams.first.click()
    expect(page.locator("#reservation-dialog")).to_be_visible()
    assert_no_violations(page, "a booking's dialog", found)
    page.locator("#reservation-close").click()

    page.get_by_role("button", name="Week", exact=True).click()
    expect(page.locator("#calendar")).to_have_attribute("aria-busy", "false")
    expect(adams.first).to_be_attached()
    assert_no_violations(page, "week view", found)
    save_screenshot(page, f"calendar-a11y-{who}-{scheme}-week")
    page.context.close()
    assert not found, "\n".join(found)


def tab_to(page: Page, element_id: str, limit: int = 40) -> None:
    """Press Tab until the element with this id has the focus."""
    for _ in range(limit):
        if page.evaluate("document.activeElement?.id") == element_id:
            return
        page.keyboard.press("Tab")
    raise AssertionError(f"Tab never reached #{element_id}")


def test_a_researcher_books_extends_and_cancels_with_the_keyboard_alone(asgi_server, live_lab, browser):
    rita, gpus = live_lab["researcher"], live_lab["gpus"]
    page = open_calendar(browser, asgi_server, rita, init_script=COUNT_POINTER_EVENTS)
    cursor = page.locator("#slot-cursor")

    # From the page's own button, Tab reaches the grid's cursor, which says where it is.
    page.get_by_role("button", name="New booking…").focus()
    page.keyboard.press("Tab")
    expect(cursor).to_be_focused()
    # Its first slot is this hour: booked from now on.
    expect(cursor).to_have_accessible_name(
        re.compile(r"^GPU 0 · A100 80 GB on live-a100, .*: free\. Enter books it from now\.$")
    )
    expect(cursor).to_have_accessible_description(re.compile(r"Tab to the grid's cursor"))

    # GPU 1, tomorrow 10:00, two hours.
    for key in ["ArrowDown", "PageDown", "Home", *["ArrowRight"] * 10, "Shift+ArrowRight"]:
        page.keyboard.press(key)
    day = f"{tomorrow_at(0):%a, %b} {tomorrow_at(0).day}"
    expect(cursor).to_have_accessible_name(
        f"GPU 1 · A100 80 GB on live-a100, {day}, 10:00 to 12:00: free. Enter books it."
    )
    save_screenshot(page, "calendar-a11y-keyboard-cursor")

    # Enter: the booking dialog, with that GPU and time, the focus in it.
    page.keyboard.press("Enter")
    dialog = page.locator("#booking-dialog")
    expect(dialog).to_be_visible()
    expect(dialog.get_by_label("GPU 1 · A100 80 GB")).to_be_checked()
    expect(dialog.get_by_label("GPU 0 · A100 80 GB")).not_to_be_checked()
    expect(dialog.get_by_label("Start")).to_have_value(f"{tomorrow_at(10):%Y-%m-%dT%H:%M}")
    expect(dialog.get_by_label("End")).to_have_value(f"{tomorrow_at(12):%Y-%m-%dT%H:%M}")
    expect(dialog.get_by_label("Purpose")).to_be_focused()
    page.keyboard.type("keyboard only")
    # The focus stays in the dialog while it is open (a modal dialog: the page behind is inert).
    for _ in range(30):
        page.keyboard.press("Tab")
        assert page.evaluate("document.getElementById('booking-dialog').contains(document.activeElement)")
    tab_to(page, "booking-submit")
    page.keyboard.press("Enter")

    expect(dialog).to_be_hidden()
    expect(cursor).to_be_focused()  # back where the person was
    expect(page.locator("#calendar-status")).to_contain_text("Booked live-a100 GPU 1")
    made = Reservation.objects.get(user=rita, purpose="keyboard only")
    assert (made.start, made.end, [gpu.pk for gpu in made.gpus.all()]) == (
        tomorrow_at(10),
        tomorrow_at(12),
        [gpus[1].pk],
    )
    expect(cursor).to_have_accessible_name(
        re.compile(rf"10:00 to 12:00: booked by rita \(you\), {day}, 10:00 to 12:00, approved\. Enter opens it\.$")
    )

    # Enter on the booking: its dialog; "+1 hour" extends it.
    page.keyboard.press("Enter")
    held = page.locator("#reservation-dialog")
    expect(held).to_be_visible()
    expect(held.get_by_role("heading")).to_be_focused()
    tab_to(page, "reservation-extend-hour")
    page.keyboard.press("Enter")
    expect(held).to_be_hidden()
    expect(cursor).to_be_focused()
    expect(page.locator("#calendar-status")).to_contain_text(f"Booking #{made.pk} now ends")
    made.refresh_from_db()
    assert made.end == tomorrow_at(13)
    expect(cursor).to_have_accessible_name(re.compile(r"booked by rita \(you\), .*10:00 to 13:00, approved"))

    # Enter again, then "Cancel booking".
    page.keyboard.press("Enter")
    expect(held).to_be_visible()
    tab_to(page, "reservation-cancel")
    page.keyboard.press("Enter")
    expect(held).to_be_hidden()
    expect(page.locator("#calendar-status")).to_contain_text(f"Booking #{made.pk} cancelled.")
    made.refresh_from_db()
    assert made.status == Reservation.Status.CANCELLED
    expect(cursor).to_have_accessible_name(re.compile(r"10:00 to 12:00: free\. Enter books it\.$"))

    assert page.evaluate("window.pointerEvents") == 0, "a mouse or touch event reached the page"
    page.context.close()


def test_the_cursor_says_why_a_slot_cannot_be_booked_and_opens_what_lies_there(asgi_server, lab, browser):
    page = open_calendar(browser, asgi_server, lab["researcher"])
    cursor = page.locator("#slot-cursor")
    cursor.focus()
    # The rows go by node name: gpu-h100's four GPUs, then live-a100's two. The cursor starts on the first.
    expect(cursor).to_have_accessible_name(re.compile(r"^GPU 0 · .* on gpu-h100, "))
    page.keyboard.press("PageUp")  # this hour yesterday: the past
    expect(cursor).to_have_accessible_name(re.compile(r": past\.$"))
    page.keyboard.press("Enter")
    expect(cursor).to_have_accessible_name(
        re.compile(r"past\. Past time cannot be booked: start a booking now or later\.$")
    )
    expect(page.locator("#booking-dialog")).to_be_hidden()

    # Tomorrow 09:00 on gpu-h100's GPU 0: adam's pending request; 07:00 on its GPU 1: maintenance.
    for key in ["PageDown", "PageDown", "Home", *["ArrowRight"] * 9]:
        page.keyboard.press(key)
    expect(cursor).to_have_accessible_name(
        re.compile(r"^GPU 0 · .* on gpu-h100, .*09:00 to 10:00: booked by adam, .*09:00 to 11:00, pending approval\. ")
    )
    for key in ["ArrowDown", "ArrowLeft", "ArrowLeft"]:
        page.keyboard.press(key)
    expect(cursor).to_have_accessible_name(
        re.compile(r"^GPU 1 · .* on gpu-h100, .*07:00 to 08:00: maintenance: .*new PSU")
    )

    # live-a100's GPU 1 at 10:00: adam's booking, a block; Enter opens its details, Escape comes back.
    for key in ["ArrowDown", "ArrowDown", "ArrowDown", "ArrowDown", "ArrowRight", "ArrowRight", "ArrowRight"]:
        page.keyboard.press(key)
    expect(cursor).to_have_accessible_name(
        re.compile(
            r"^GPU 1 · .* on live-a100, .*10:00 to 11:00: "
            r"booked by adam, .*10:00 to 12:00, approved\. Enter opens it\.$"
        )
    )
    page.keyboard.press("Enter")
    expect(page.locator("#reservation-dialog").get_by_role("heading")).to_have_text("Booked by adam")
    page.keyboard.press("Escape")
    expect(cursor).to_be_focused()
    page.keyboard.press("ArrowDown")  # the last row: it stays
    expect(cursor).to_have_accessible_name(re.compile(r"^GPU 1 · .* on live-a100, "))
    page.context.close()


def test_others_changes_are_said_politely_once_shown(asgi_server, live_lab, browser):
    rita, adam, gpus = live_lab["researcher"], live_lab["admin"], live_lab["gpus"]
    page = open_calendar(browser, asgi_server, rita)
    open_tomorrow(page)
    news = page.locator("#calendar-news")
    expect(news).to_have_attribute("aria-live", "polite")
    expect(news).to_have_text("")
    reservation_create(user=adam, gpus=[gpus[1]], start=tomorrow_at(10), end=tomorrow_at(12))
    expect(page.locator(".run-blocks .block", has_text="adam")).to_be_visible()
    expect(news).to_have_text("Bookings changed on live-a100; the calendar shows them.")
    page.context.close()


@pytest.mark.parametrize(
    ("name", "context_args"),
    [
        ("desktop", {"viewport": {"width": 1280, "height": 800}}),
        ("phone", {"viewport": {"width": 390, "height": 844}, "is_mobile": True, "has_touch": True}),
        # 200 % zoom: a 1280 × 800 window showing pages at twice the size is a 640 × 400 CSS viewport.
        ("zoom200", {"viewport": {"width": 640, "height": 400}, "device_scale_factor": 2}),
    ],
)
def test_screenshots_of_the_calendar_and_status_page_at_each_size(asgi_server, lab, browser, name, context_args):
    page = open_calendar(browser, asgi_server, lab["researcher"], **context_args)
    open_tomorrow(page)
    assert not (violations := axe_violations(page)), described(violations)
    save_screenshot(page, f"calendar-{name}")
    page.goto(f"{asgi_server.url}/status/")
    expect(page.locator("#live-state")).to_have_text("Live")
    assert not (violations := axe_violations(page)), described(violations)
    save_screenshot(page, f"status-{name}")
    page.context.close()


def test_the_status_page_says_changes_of_state_politely_and_never_readings(asgi_server, live_lab, browser):
    post_agent(asgi_server, live_lab, "heartbeat", heartbeat()).raise_for_status()
    context = browser.new_context()
    give_session(context, asgi_server, live_lab["admin"])
    page = context.new_page()
    page.goto(f"{asgi_server.url}/status/")
    expect(page.locator("#live-state")).to_have_text("Live")
    news = page.locator("#status-news")
    expect(news).to_have_attribute("aria-live", "polite")
    expect(page.locator("#fleet")).to_have_attribute("aria-live", "off")

    post_agent(asgi_server, live_lab, "telemetry", telemetry(utilization=77)).raise_for_status()
    expect(page.locator(".gpu-card").first).to_contain_text("77 %")
    page.wait_for_timeout(1500)  # past the news' one-second gathering
    expect(news).to_have_text("")  # a reading is not news

    gpu_drain(gpu=live_lab["gpus"][1], reason="fan failure")
    expect(news).to_have_text("live-a100 GPU 1: Drained.")
    alert_open(
        subject=Subject(Alert.Kind.TEMPERATURE, live_lab["node"].pk, live_lab["gpus"][0].pk),
        now=timezone.now(),
        details={},
    )
    expect(news).to_have_text(re.compile(r"^Alert: .+, live-a100 GPU 0\.$"))
    context.close()
