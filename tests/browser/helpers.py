"""What the browser tests do in Chromium, again and again: find Chromium, log in (by the form, or with a
session cookie), save screenshots, collect what went wrong on a page, and move about the calendar.

Plain functions; the fixtures that use them are in conftest.py. bench/calendar_render.py imports this module
before Django is set up, so nothing here imports the portal's apps at import time.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
from collections.abc import Callable
from datetime import UTC, datetime, time, timedelta
from pathlib import Path

from django.conf import settings
from django.utils import timezone
from playwright.sync_api import Page, expect

CHROMIUM_CANDIDATES = ("/usr/lib/chromium/chromium", "/usr/bin/chromium")
# Without these Chromium keeps calling home, and this machine's closed network refuses each call.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def chromium_path() -> str | None:
    """Debian's Chromium, where it is installed (None when it is not)."""
    return next((path for path in CHROMIUM_CANDIDATES if os.path.exists(path)), shutil.which("chromium"))


# --- logging in -------------------------------------------------------------------------------


def log_in(page, server, username: str, password: str = "correct horse battery staple") -> None:  # noqa: S107 - the factories' test password
    """Log in through the login form; ``server`` is live_server (or anything with .url) or the base URL."""
    base = server if isinstance(server, str) else server.url
    page.goto(f"{base}/accounts/login/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"{base}/")


def give_session(context, server, user) -> None:
    """Give the browser context ``user``'s logged-in session on ``server`` (tests/live/server.py's
    AsgiServer), as if they had used the login form."""
    from tests.live.server import session_for

    context.add_cookies([{"name": "sessionid", "value": session_for(user), "url": server.url}])


def open_page(page, server, user, path: str = "/status/") -> None:
    """Open ``path`` on ``server`` as ``user`` (logged in by cookie)."""
    give_session(page.context, server, user)
    page.goto(f"{server.url}{path}")


# --- what a page shows, and what went wrong on it -------------------------------------------------


def save_screenshot(page, name: str) -> Path:
    """Save the page as var/screenshots/<name>.png (or under $SCREENSHOT_DIR)."""
    directory = Path(os.environ.get("SCREENSHOT_DIR", settings.BASE_DIR / "var" / "screenshots"))
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


# --- the Content-Security-Policy (kernel/csp.py) ----------------------------------------------------

# Runs in every page and frame before the page's own scripts (an init script, which the policy does not govern):
# each violation of the policy, reported to Python through a binding (%s: its name).
CSP_LISTENER = """
document.addEventListener('securitypolicyviolation', (event) => {
  window.%s(`${event.effectiveDirective} refused ${event.blockedURI || 'inline'} `
    + `at ${event.sourceFile || event.documentURI}:${event.lineNumber} on ${event.documentURI}`
    + (event.sample ? `: ${event.sample}` : ''));
}, true);
"""
_bindings = itertools.count()


def watch_csp(target, report: Callable[[str], None]) -> None:
    """Call ``report`` with a line for every Content-Security-Policy violation (the ``securitypolicyviolation``
    event) in ``target``, a browser context or one page, from now on. Each call has a binding of its own, so a
    page and its context can both be watched."""
    name = f"__cspViolation{next(_bindings)}"
    target.expose_function(name, lambda text: report(text))  # a plain function: Playwright tags it
    target.add_init_script(CSP_LISTENER % name)


def is_csp_message(text: str) -> bool:
    """A console line of Chromium's about a violation of the page's Content-Security-Policy ("Refused to load the
    script ...", "Applying inline style violates the following Content Security Policy directive ...")."""
    return "Content Security Policy" in text or "Refused to" in text


class Problems:
    """What went wrong on a page since the last ``take()``: console errors, uncaught script errors and every
    violation of the Content-Security-Policy (as the page's event and as a console line of any level), and, with
    ``requests``, failed or refused (4xx, 5xx) requests."""

    def __init__(self, page: Page, *, requests: bool = True) -> None:
        self.seen: list[str] = []
        watch_csp(page, lambda violation: self.seen.append(f"csp: {violation}"))
        page.on("console", self.console)
        page.on("pageerror", lambda error: self.seen.append(f"uncaught: {error}"))
        if requests:
            page.on("requestfailed", lambda request: self.seen.append(f"failed: {request.url} {request.failure}"))
            page.on("response", self.response)

    def console(self, message) -> None:
        if message.type == "error" or is_csp_message(message.text):
            self.seen.append(f"console: {message.text} ({message.location.get('url')})")

    def response(self, response) -> None:
        if response.status >= 400:
            self.seen.append(f"{response.status}: {response.url}")

    def take(self) -> list[str]:
        seen, self.seen = self.seen, []
        return seen


# --- the booking calendar ---------------------------------------------------------------------


def tomorrow_at(hour: int) -> datetime:
    day = (timezone.now() + timedelta(days=1)).date()
    return datetime.combine(day, time(hour), tzinfo=UTC)


def open_calendar(browser, server, user, *, init_script: str | None = None, **context_args) -> Page:
    """The calendar on ``server`` (tests/live/server.py's AsgiServer) for ``user``, in a browser context of its own
    (``context_args``: viewport, timezone_id, color_scheme...; a 1280 × 800 window unless told), drawn, its
    bookings loaded and its live connection up. ``init_script`` runs in the page before its own scripts."""
    context = browser.new_context(**({"viewport": {"width": 1280, "height": 800}} | context_args))
    if init_script:
        context.add_init_script(init_script)
    give_session(context, server, user)
    page = context.new_page()
    page.goto(f"{server.url}/")
    expect(page.locator("#calendar")).to_have_attribute("aria-busy", "false")
    expect(page.locator("#live-state")).to_have_text("Live")
    return page


def first_day(page: Page):
    """The date of the first day the calendar shows, as its column header says ("2030-01-07")."""
    return page.locator(".ec-header .ec-col-head time").first


def open_tomorrow(page: Page) -> None:
    """Go to tomorrow (the day view shows it and the day after) and wait until it is drawn and its
    bookings are loaded."""
    page.get_by_role("button", name="Next day").click()
    expect(first_day(page)).to_have_attribute("datetime", f"{tomorrow_at(0):%Y-%m-%d}")
    expect(page.locator("#calendar")).to_have_attribute("aria-busy", "false")


def block(page: Page, reservation):
    """Someone else's booking, drawn as a light block (not a calendar event)."""
    return page.locator(f'.run-blocks .block[data-reservation-id="{reservation.pk}"]')


def slot_x(page: Page, label: str) -> float:
    """The left edge of the time column labelled ``label`` (like "10:00") in the header."""
    slot = page.locator(".ec-header .ec-slot", has_text=re.compile(rf"^{label}$")).first
    slot.scroll_into_view_if_needed()
    return slot.bounding_box()["x"]


def row_head(page: Page, name: str):
    """The row labels (in the grid's first column) whose text matches ``name``, a regular expression.
    EventCalendar's table roles are taken off (calendar.js, "Accessibility"), so rows are found by their text."""
    return page.locator(".ec-sidebar .ec-row-head").filter(has=page.locator(".row-label", has_text=re.compile(name)))


def row_y(page: Page, gpu_index: int, row: str | None = None) -> float:
    """The middle of a GPU's row: the first whose header starts "GPU <index> ·", or the one whose header
    matches ``row`` (a regular expression: a MIG slice's row, say "^GPU 0 · 3g\\.40gb$")."""
    box = row_head(page, row or rf"^GPU {gpu_index} ·").first.bounding_box()
    return box["y"] + box["height"] / 2


def settled(page: Page) -> None:
    """Wait until the calendar's grid has kept its place for two frames in a row (at most about a second)."""
    page.evaluate(
        """async () => {
            const grid = document.querySelector('#calendar');
            const frame = () => new Promise(requestAnimationFrame);
            let last = null;
            for (let i = 0; i < 60; i++) {
                await frame();
                const box = grid ? JSON.stringify(grid.getBoundingClientRect()) + grid.scrollHeight : '';
                if (box === last) return;
                last = box;
            }
        }"""
    )


def drag(page: Page, gpu_index: int, start: str, end: str, *, backwards: bool = False, row: str | None = None) -> None:
    """Select start..end on the GPU's row (or the row ``row`` names, see row_y): press at one end, move to
    the other, release. ``backwards`` starts at the end (so the press lands on free time when the start is
    booked)."""
    settled(page)  # a full-page screenshot just before resizes the window, and the calendar redraws after it
    y = row_y(page, gpu_index, row)
    x0, x1 = slot_x(page, start) + 2, slot_x(page, end) - 2
    if backwards:
        x0, x1 = x1, x0
    page.mouse.move(x0, y)
    page.mouse.down()
    page.mouse.move((x0 + x1) / 2, y, steps=5)
    page.mouse.move(x1, y, steps=5)
    page.mouse.up()
