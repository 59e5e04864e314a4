"""Every page, for a researcher and for an admin, loads without a console error, an uncaught script
error, a failed request (a 404 for a favicon or an asset counts) or anything the Content-Security-Policy
refused (kernel/csp.py: its ``securitypolicyviolation`` events and Chromium's "Refused to ..." lines): served by
the real ASGI server, so the pages' websockets connect as in production. The calendar's booking dialog, its
series preview, the API's Swagger UI and browsable pages, Django admin's widgets and the error pages are used,
not only opened, so the scripts they start run under the policy too."""

from __future__ import annotations

from datetime import timedelta

import pytest
from playwright.sync_api import Page, expect

from reservations.series import series_create
from tests.browser.helpers import Problems, drag, give_session, open_tomorrow, tomorrow_at
from tests.factories import book
from tests.live.server import heartbeat, post_agent, telemetry

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def lab(lab_in_every_state):
    """lab_in_every_state (GPUs in every state, an open alert, waitlist offers, maintenance, reserved capacity),
    plus a pending booking and a weekly series of the researcher's; the admin may use every admin page."""
    researcher, gpus = lab_in_every_state["researcher"], lab_in_every_state["gpus"]
    lab_in_every_state["admin"].is_superuser = True  # staff alone opens no admin form (403)
    lab_in_every_state["admin"].save()
    in_two_days = tomorrow_at(20) + timedelta(days=1)
    pending = book(researcher, gpus[1:2], in_two_days, in_two_days + timedelta(hours=2), pending=True, direct=True)
    weekly = series_create(
        user=researcher,
        gpus=[gpus[0]],
        start=tomorrow_at(20),
        end=tomorrow_at(22),
        rule="FREQ=WEEKLY;COUNT=3",
        zone="UTC",
        mode="skip",
    )
    return {**lab_in_every_state, "pending": pending, "series": weekly.series}


def visit(page: Page, problems: Problems, url: str) -> list[str]:
    page.goto(url)
    page.wait_for_load_state("networkidle")
    return problems.take()


def pages_of(lab: dict, *, admin: bool) -> list[str]:
    running, pending = lab["running"].pk, lab["pending"].pk
    paths = [
        "/",
        "/reservations/mine/",
        f"/reservations/{running}/",
        f"/series/{lab['series'].pk}/",
        "/status/",
        "/reports/",
        "/waitlist/",
        "/profile/",
        "/profile/mail/",
        "/api/docs/",
        "/api/v1/reservations/",  # DRF's browsable API, as a browser asks for it
    ]
    if admin:
        paths += [
            "/reservations/pending/",
            f"/reservations/{pending}/",
            "/fairshare/",
            "/waitlist/queue/",
            "/admin/",
            "/admin/reservations/reservation/",
            f"/admin/reservations/reservation/{running}/change/",
            "/admin/reservations/limit/add/",  # the user's autocomplete (select2, jQuery)
            "/admin/reservations/maintenancewindow/add/",  # the date and time pickers
            "/admin/reservations/series/",
            "/admin/nodes/node/",
            f"/admin/nodes/node/{lab['node'].pk}/change/",
            "/admin/alerts/alert/",
            "/admin/accounts/user/",
            f"/admin/accounts/user/{lab['researcher'].pk}/change/",
        ]
    return paths


def use(page: Page, path: str) -> None:
    """Work the page's scripts a little, as a person would, where opening it runs only part of them."""
    if path == "/":
        expect(page.locator("#calendar")).to_have_attribute("aria-busy", "false")
        expect(page.locator("#live-state")).to_have_text("Live")
        page.get_by_role("button", name="Week", exact=True).click()
        expect(page.locator("#calendar")).to_have_attribute("aria-busy", "false")
        page.get_by_role("button", name="Next week").click()
        expect(page.locator("#calendar")).to_have_attribute("aria-busy", "false")
        page.get_by_role("button", name="Day", exact=True).click()
        page.get_by_role("button", name="Today").click()
        open_tomorrow(page)
        # Free on GPU 0: the booking dialog and its advice (two requests once the times settle: waited for, or
        # leaving the page would cut them off), then the series' preview.
        with (
            page.expect_response(lambda response: "/api/v1/availability/suggest/" in response.url),
            page.expect_response(lambda response: "/api/v1/me/length-advice/" in response.url),
        ):
            drag(page, 0, "18:00", "20:00")
        dialog = page.locator("#booking-dialog")
        expect(dialog).to_be_visible()
        dialog.get_by_label("Repeat", exact=True).select_option("weekly")
        dialog.get_by_label("Until (last day)").fill(f"{tomorrow_at(0) + timedelta(days=14):%Y-%m-%d}")
        dialog.get_by_role("button", name="Preview").click()
        expect(page.locator("#booking-report")).to_contain_text("Preview:")
        page.keyboard.press("Escape")
        expect(dialog).to_be_hidden()
    elif path == "/status/":
        expect(page.locator("#live-state")).to_have_text("Live")
    elif path == "/api/docs/":
        expect(page.locator(".swagger-ui .info .title")).to_contain_text("GPU booking portal API")
        page.locator(".opblock-summary").first.click()  # an operation opened: its parameters and responses drawn
        expect(page.locator(".opblock-body").first).to_be_visible()
    elif path == "/admin/reservations/maintenancewindow/add/":
        page.locator(".datetimeshortcuts a", has_text="Today").first.click()
        page.locator("#calendarlink0").click()
        expect(page.locator("#calendarbox0")).to_be_visible()
        page.locator("#calendarbox0 .calendar-cancel a").click()
    elif path == "/admin/reservations/limit/add/":
        page.locator(".select2-selection").first.click()
        expect(page.locator(".select2-results__option").first).to_be_visible()
        page.keyboard.press("Escape")
    page.wait_for_load_state("networkidle")


@pytest.mark.parametrize("role", ["researcher", "admin"])
def test_no_page_logs_an_error_fails_a_request_or_breaks_the_policy(asgi_server, lab, browser, role):
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
        use(page, path)
        found[path] += problems.take()
        if path == "/profile/":
            # The calendar feeds the profile lists are served, not opened: a browser would download them.
            for field in page.locator(".feed-url, input[readonly]").all():
                url = field.input_value()
                if url.endswith(".ics"):
                    assert page.request.get(url).status == 200, url
    # An error page: the 404 itself is expected (as a response and Chromium's console line), and nothing else.
    missing = visit(page, problems, f"{asgi_server.url}/no-such-page/")
    found["/no-such-page/"] = [seen for seen in missing if "404" not in seen]
    context.close()

    assert {path: seen for path, seen in found.items() if seen} == {}
    assert len(found) == len(pages_of(lab, admin=role == "admin")) + 2


def test_a_refused_inline_style_or_handler_is_caught(asgi_server, browser, no_csp_violation):
    """The control: what the policy refuses does reach the checks, as the page's event (here and in every browser
    test, conftest.py's no_csp_violation) and as Chromium's console line: an inline <style> and an inline event
    handler added to the login page, as injected markup would be."""
    context = browser.new_context()
    page = context.new_page()
    problems = Problems(page, requests=False)
    page.goto(f"{asgi_server.url}/accounts/login/")
    page.evaluate(
        """() => {
            const style = document.createElement('style');
            style.textContent = 'body { background: red; }';
            document.head.append(style);
            document.body.insertAdjacentHTML('beforeend', '<img alt="" src="data:," onerror="document.title = 1">');
        }"""
    )
    expect(page.locator("body")).not_to_have_css("background-color", "rgb(255, 0, 0)")
    expect(page).not_to_have_title("1")
    wanted = ("csp: style-src-elem refused inline", "csp: script-src-attr refused inline")
    seen: list[str] = []
    for _ in range(300):  # the events reach Python as the browser sends them: poll, with a deadline (30 s)
        seen += problems.take()
        if all(any(line.startswith(prefix) for line in seen) for prefix in wanted):
            break
        page.wait_for_timeout(100)
    context.close()

    for prefix in wanted:
        assert any(line.startswith(prefix) for line in seen), seen
    console = [line for line in seen if line.startswith("console: ") and "Content Security Policy" in line]
    assert any("inline style" in line for line in console), seen
    assert any("inline event handler" in line for line in console), seen
    assert {line.split(" refused")[0] for line in no_csp_violation} == {"style-src-elem", "script-src-attr"}
    no_csp_violation.clear()  # caused on purpose: the guard's own check passes
