"""The profile's calendar feeds in a real browser: copy a URL by keyboard, read the feed, rotate."""

from __future__ import annotations

from playwright.sync_api import expect

from tests.browser.helpers import log_in, save_screenshot


def test_a_researcher_copies_a_feed_url_reads_it_and_rotates(page, live_server, alice, node, request):
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=live_server.url)
    log_in(page, live_server, "alice")
    page.goto(f"{live_server.url}/profile/")

    section = page.get_by_role("region", name="Calendar feeds")
    own = section.get_by_label("My bookings", exact=True)
    url = own.input_value()
    assert url.startswith(f"{live_server.url}/feeds/{alice.pk}.mine.") and url.endswith(".ics")
    expect(section.get_by_label("gpu-a100: everyone's bookings", exact=True)).to_be_visible()
    save_screenshot(page, f"{request.node.originalname}-page")

    # Keyboard: the URL field, then its Copy button.
    own.focus()
    page.keyboard.press("Tab")
    copy = section.get_by_role("button", name="Copy the URL of my bookings' feed")
    expect(copy).to_be_focused()
    page.keyboard.press("Enter")
    expect(copy).to_have_text("Copied")
    assert page.evaluate("navigator.clipboard.readText()") == url

    feed = page.request.get(url)
    assert feed.status == 200
    assert feed.headers["content-type"] == "text/calendar; charset=utf-8"
    assert feed.text().startswith("BEGIN:VCALENDAR")

    section.get_by_role("button", name="Rotate feed URLs").click()
    expect(page.get_by_role("status").first).to_contain_text("New calendar feed URLs")
    new_url = page.get_by_role("region", name="Calendar feeds").get_by_label("My bookings", exact=True).input_value()
    assert new_url != url
    assert page.request.get(url).status == 404
    assert page.request.get(new_url).status == 200
    save_screenshot(page, f"{request.node.originalname}-rotated")
