"""Every page, for a researcher and for an admin, loads without a console error, an uncaught script
error or a failed request (a 404 for a favicon or an asset counts): served by the real ASGI server,
so the pages' websockets connect as in production."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import Page, expect

from tests.browser.helpers import Problems, give_session
from tests.factories import book
from tests.live.server import heartbeat, post_agent, telemetry

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def lab(live_lab):
    """live_lab's node reporting, one running booking of the researcher's and a pending one."""
    researcher, gpus = live_lab["researcher"], live_lab["gpus"]
    now = timezone.now()
    running = book(
        researcher, gpus[:1], now - timedelta(minutes=20), now + timedelta(hours=2), purpose="training", direct=True
    )
    tomorrow = now + timedelta(days=1)
    pending = book(
        researcher, gpus[1:2], tomorrow, tomorrow + timedelta(hours=2), purpose="sweep", pending=True, direct=True
    )
    return {**live_lab, "running": running, "pending": pending}


def visit(page: Page, problems: Problems, url: str) -> list[str]:
    page.goto(url)
    page.wait_for_load_state("networkidle")
    return problems.take()


def pages_of(lab: dict, *, admin: bool) -> list[str]:
    paths = [
        "/",
        "/reservations/mine/",
        f"/reservations/{lab['running'].pk}/",
        "/status/",
        "/reports/",
        "/profile/",
        "/profile/mail/",
        "/api/docs/",
    ]
    if admin:
        paths += ["/reservations/pending/", f"/reservations/{lab['pending'].pk}/", "/admin/"]
    return paths


@pytest.mark.parametrize("role", ["researcher", "admin"])
def test_no_page_logs_an_error_or_fails_a_request(asgi_server, lab, browser, role):
    post_agent(asgi_server, lab, "heartbeat", heartbeat()).raise_for_status()
    post_agent(asgi_server, lab, "telemetry", telemetry(utilization=60)).raise_for_status()
    user = lab[role]
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    problems = Problems(page)
    found: dict[str, list[str]] = {}

    found["/accounts/login/"] = visit(page, problems, f"{asgi_server.url}/accounts/login/")
    give_session(context, asgi_server, user)
    for path in pages_of(lab, admin=role == "admin"):
        found[path] = visit(page, problems, f"{asgi_server.url}{path}")
        if path == "/":
            expect(page.locator("#calendar")).to_have_attribute("aria-busy", "false")
            expect(page.locator("#live-state")).to_have_text("Live")
            page.get_by_role("button", name="Week", exact=True).click()
            expect(page.locator("#calendar")).to_have_attribute("aria-busy", "false")
            page.get_by_role("button", name="Next week").click()
            expect(page.locator("#calendar")).to_have_attribute("aria-busy", "false")
            page.wait_for_load_state("networkidle")
            found["/ (week view)"] = problems.take()
        if path == "/profile/":
            # The calendar feeds the profile lists are served, not opened: a browser would download them.
            for field in page.locator(".feed-url, input[readonly]").all():
                url = field.input_value()
                if url.endswith(".ics"):
                    assert page.request.get(url).status == 200, url
    context.close()

    assert {path: seen for path, seen in found.items() if seen} == {}
    assert len(found) == len(pages_of(lab, admin=role == "admin")) + 2
