"""The dark scheme (static/css/dark.css): with the system set to dark (the browser context's color_scheme), every
page is dark and still meets WCAG 2.1 AA as axe-core checks it (tests/browser/accessibility.py), for a researcher
and an admin, with the status page in every state and bookings approved, pending, offered and waiting; the light
scheme is left as it was. Screenshots (var/screenshots/dark-*.png) are for people to look at, the calendar's too.

The calendar is only looked at, not checked by axe: its library's grid markup still has the violations issue 24
fixes next (tests/browser/test_accessibility.py)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.utils import timezone
from playwright.sync_api import expect

from alerts.models import Alert
from alerts.records import Subject, alert_open
from nodes.services import gpu_drain
from reservations.models import MaintenanceWindow, ReservedCapacity
from reservations.services import reservation_cancel, reservation_create
from tests.browser.accessibility import axe_violations, described
from tests.browser.helpers import open_page, open_tomorrow, save_screenshot, tomorrow_at
from tests.factories import book, node_with_gpus
from tests.live.server import heartbeat, post_agent, telemetry
from waitlist.services import Want, entry_join

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser_context_args(color_scheme="dark")]

# The colours a page is drawn in: its root's background and text, the card's background (where it has one),
# each as WCAG relative luminance, and the last stylesheet, which must be dark.css for its rules to win.
COLOURS = """() => {
  const luminance = (css) => {
    const [r, g, b] = css.match(/[\\d.]+/g).slice(0, 3).map((c) => {
      const s = Number(c) / 255;
      return s <= 0.03928 ? s / 12.92 : ((s + 0.055) / 1.055) ** 2.4;
    });
    return 0.2126 * r + 0.7152 * g + 0.0722 * b;
  };
  const root = getComputedStyle(document.documentElement);
  const card = document.querySelector('.card, .gpu-card, table');
  const sheets = [...document.styleSheets].map((sheet) => sheet.href || '');
  return {
    background: luminance(root.backgroundColor),
    text: luminance(root.color),
    card: card ? luminance(getComputedStyle(card).backgroundColor) : null,
    scheme: root.colorScheme,
    last_sheet: sheets[sheets.length - 1].split('/').pop(),
  };
}"""


def assert_dark(page) -> None:
    colours = page.evaluate(COLOURS)
    assert colours["last_sheet"] == "dark.css", f"{page.url}: dark.css must come last, after the page's stylesheets"
    assert colours["scheme"] == "dark", page.url
    assert colours["background"] < 0.02, f"{page.url}: the page is not dark: {colours}"
    assert colours["text"] > 0.6, f"{page.url}: the text is not light: {colours}"
    if colours["card"] is not None:
        assert colours["card"] < 0.03, f"{page.url}: its cards are not dark: {colours}"


@pytest.fixture
def lab_in_every_state(asgi_server, live_lab):
    """tests/browser/test_accessibility.py's lab (GPUs free, in use, drained and offline, under maintenance, an
    alert) and, tomorrow, someone else's booking, a pending one, a slot offered from the waitlist and one waited
    for, maintenance and reserved capacity: every state the calendar and the lists draw."""
    now = timezone.now()
    researcher, admin, gpus = live_lab["researcher"], live_lab["admin"], live_lab["gpus"]
    running = book(researcher, [gpus[0]], now - timedelta(minutes=30), now + timedelta(hours=2), direct=True)
    book(researcher, [gpus[1]], tomorrow_at(6), tomorrow_at(8), purpose="thesis", direct=True)
    book(researcher, [gpus[1]], tomorrow_at(9), tomorrow_at(11), purpose="ablation", pending=True, direct=True)
    book(admin, [gpus[1]], tomorrow_at(12), tomorrow_at(15), purpose="benchmarks", direct=True)
    freed = reservation_create(user=admin, gpus=[gpus[0]], start=tomorrow_at(8), end=tomorrow_at(10))
    for gpu, start in ((gpus[0], 8), (gpus[1], 12)):  # the first is offered once freed, the second waits
        want = Want(
            gpus=[gpu],
            earliest_start=tomorrow_at(start),
            latest_end=tomorrow_at(start + 2),
            duration=timedelta(hours=2),
            auto_book=False,
        )
        entry_join(user=researcher, want=want)
    reservation_cancel(reservation=freed, actor=admin)
    hour = timedelta(hours=1)
    MaintenanceWindow.objects.create(
        node=live_lab["node"], gpu=gpus[1], start=tomorrow_at(16), end=tomorrow_at(18), reason="driver update"
    )
    vision = Group.objects.create(name="vision")
    window = ReservedCapacity.objects.create(
        group=vision, node=live_lab["node"], start=tomorrow_at(13), end=tomorrow_at(17), label="paper deadline"
    )
    window.gpus.set([gpus[0]])

    post_agent(asgi_server, live_lab, "heartbeat", heartbeat()).raise_for_status()
    post_agent(asgi_server, live_lab, "telemetry", telemetry(utilization=35)).raise_for_status()
    silent = node_with_gpus(3, name="silent-h100")  # never reported: offline
    drained, kept, _ = silent.gpus.order_by("index")
    gpu_drain(gpu=drained, reason="fan failure")
    MaintenanceWindow.objects.create(node=silent, gpu=kept, start=now - hour, end=now + hour, reason="new PSU")
    alert_open(subject=Subject(Alert.Kind.TEMPERATURE, live_lab["node"].pk, gpus[0].pk), now=now, details={})
    return {**live_lab, "running": running}


PAGES = ["/status/", "/reservations/mine/", "/waitlist/", "/profile/", "/reports/", "/reservations/{running}/"]
ADMIN_PAGES = ["/reservations/pending/", "/fairshare/", "/waitlist/queue/"]


def shot_name(who: str, path: str) -> str:
    if path.startswith("/reservations/{"):
        return f"dark-{who}-booking"
    return f"dark-{who}-{path.strip('/').replace('/', '-')}"


@pytest.mark.parametrize("who", ["researcher", "admin"])
def test_every_page_is_dark_and_meets_wcag_2_1_aa(asgi_server, lab_in_every_state, page, who):
    found = []
    for path in PAGES + (ADMIN_PAGES if who == "admin" else []):
        open_page(page, asgi_server, lab_in_every_state[who], path.format(running=lab_in_every_state["running"].pk))
        page.wait_for_load_state("networkidle")
        if path == "/status/":
            page.locator('.state-badge[data-role="state"]', has_text="Free").first.wait_for()
        save_screenshot(page, shot_name(who, path))
        assert_dark(page)
        violations = axe_violations(page)
        if violations:
            found.append(f"{path}:\n{described(violations)}")
    assert not found, "\n".join(found)


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
