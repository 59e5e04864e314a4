"""axe-core's WCAG 2.1 A and AA rules on the portal's pages, for a researcher and an admin, in the states people
see (issue 24; tests/browser/accessibility.py): the status page with GPUs free, in use, drained, under maintenance and
offline and an open alert; bookings, waitlist, profile with tokens and
feeds, reports with data, a booking's page, and for admins approvals, fair share, the waitlist queue and the Django
admin pages they work in (bookings, limits, maintenance, nodes, alerts, people); the login form; a mail's HTML part;
in the light and the dark scheme. A failure names each rule and element.

The calendar, its keyboard path and its dialogs are checked in test_calendar_accessibility.py; the dark scheme in
test_dark_mode.py."""

from __future__ import annotations

import pytest

from notifications.models import Notification
from notifications.services import notification_deliver
from reservations.services import reservation_create
from tests.browser.accessibility import assert_dark, axe_violations, described
from tests.browser.helpers import open_page, save_screenshot, tomorrow_at
from tests.mailserver import html_of

PAGES = ["/status/", "/reservations/mine/", "/waitlist/", "/profile/", "/reports/", "/reservations/{running}/"]
ADMIN_PAGES = [
    "/reservations/pending/",
    "/fairshare/",
    "/waitlist/queue/",
    # Django admin, where admins approve, set limits and block maintenance windows.
    "/admin/",
    "/admin/reservations/reservation/",
    "/admin/reservations/reservation/{running}/change/",
    "/admin/reservations/limit/add/",
    "/admin/reservations/maintenancewindow/add/",
    "/admin/nodes/node/",
    "/admin/alerts/alert/",
    "/admin/accounts/user/",
]


def shot_name(who: str, scheme: str, path: str) -> str:
    page = path.strip("/").replace("/", "-").replace("{running}", "booking")
    return f"accessibility-{scheme}-{who}-{page}"


@pytest.mark.parametrize("scheme", ["light", "dark"])
@pytest.mark.parametrize("who", ["researcher", "admin"])
def test_every_page_meets_wcag_2_1_aa(asgi_server, lab_in_every_state, page, who, scheme):
    page.emulate_media(color_scheme=scheme)
    found = []
    for path in PAGES + (ADMIN_PAGES if who == "admin" else []):
        open_page(page, asgi_server, lab_in_every_state[who], path.format(running=lab_in_every_state["running"].pk))
        page.wait_for_load_state("networkidle")
        if path == "/status/":
            for state in ("Free", "In use", "Drained", "Maintenance", "Offline"):
                page.locator('.state-badge[data-role="state"]', has_text=state).first.wait_for()
        save_screenshot(page, shot_name(who, scheme, path))
        if scheme == "dark" and not path.startswith("/admin/"):  # Django admin has its own dark scheme
            assert_dark(page)
        violations = axe_violations(page)
        if violations:
            found.append(f"{path}:\n{described(violations)}")
    assert not found, "\n".join(found)


def test_the_login_form_meets_wcag_2_1_aa(asgi_server, page):
    page.goto(f"{asgi_server.url}/accounts/login/")
    assert not (violations := axe_violations(page)), described(violations)


def test_a_mails_html_part_meets_wcag_2_1_aa(live_lab, smtp_server, page):
    researcher, gpu = live_lab["researcher"], live_lab["gpus"][0]
    reservation_create(user=researcher, gpus=[gpu], start=tomorrow_at(10), end=tomorrow_at(12))
    for note in Notification.objects.filter(reservation__user=researcher):
        notification_deliver(note.pk)  # what the worker does once the booking commits
    [mail] = smtp_server.wait_for(1)
    page.set_content(html_of(mail))
    assert not (violations := axe_violations(page)), described(violations)
