"""The waitlist as a person meets it: a booking refused because the slot is taken offers to wait for it; the
form comes filled in; when the slot frees up it is held for them, and they claim it."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from playwright.sync_api import expect

from reservations.models import Reservation
from reservations.services import reservation_cancel, reservation_create
from tests.browser.helpers import drag, log_in, open_page, open_tomorrow, tomorrow_at
from waitlist.models import Entry
from waitlist.services import Want, entry_join

pytestmark = pytest.mark.django_db(transaction=True)


def test_join_the_waitlist_from_a_refusal_then_claim_the_offer(page, live_server, alice, bob, gpus, screenshot):
    taken = reservation_create(user=bob, gpus=[gpus[1]], start=tomorrow_at(10), end=tomorrow_at(12))
    log_in(page, live_server, "alice")
    open_tomorrow(page)
    drag(page, 1, "11:00", "13:00", backwards=True)  # 11:00-12:00 is bob's
    dialog = page.locator("#booking-dialog")
    dialog.get_by_role("button", name="Book").click()
    expect(page.locator("#booking-error")).to_contain_text(re.compile(r"is booked .* by bob"))
    screenshot("refused")

    page.get_by_role("link", name="Join the waitlist for it").click()
    expect(page.get_by_role("heading", name="Join the waitlist")).to_be_visible()
    expect(page.get_by_label("These GPUs")).to_have_values([str(gpus[1].pk)])
    expect(page.get_by_label("For", exact=True)).to_have_value("120")
    page.get_by_label("Book it for me at once when it comes free").uncheck()
    page.get_by_role("button", name="Join").click()
    expect(page.locator(".messages")).to_contain_text("You are on the waitlist for gpu-a100/GPU 1 for 2 h.")
    entry = Entry.objects.get(user=alice)
    assert (entry.earliest_start, entry.latest_end, entry.auto_book) == (tomorrow_at(11), tomorrow_at(13), False)
    screenshot("waiting")

    reservation_cancel(reservation=taken, actor=bob)  # committed: the slot is offered to alice and held
    # The calendar shows the held slot; its details lead to the waitlist, where she claims it.
    page.goto(f"{live_server.url}/")
    open_tomorrow(page)
    held = page.locator(".run-blocks .block.offered, .ec-event.offered", has_text="alice")
    expect(held).to_be_visible()
    screenshot("offered-on-the-calendar")
    held.click()
    page.get_by_role("link", name="Claim or decline it on your waitlist").click()
    offer = page.locator(f"#entry-{entry.pk}")
    expect(offer).to_contain_text("Held for you until")
    screenshot("offered")
    offer.get_by_role("button", name="Claim it").click()
    expect(page.locator(".messages")).to_contain_text("The slot is yours")
    booking = Reservation.objects.get(user=alice)
    assert (booking.status, booking.start, booking.end) == ("approved", tomorrow_at(11), tomorrow_at(13))


def test_an_offer_appears_on_the_waitlist_page_without_a_reload(asgi_server, live_lab, page, screenshot):
    researcher, admin, gpus = live_lab["researcher"], live_lab["admin"], live_lab["gpus"]
    taken = reservation_create(user=admin, gpus=[gpus[0]], start=tomorrow_at(10), end=tomorrow_at(12))
    want = Want(
        gpus=[gpus[0]],
        earliest_start=tomorrow_at(10),
        latest_end=tomorrow_at(12),
        duration=timedelta(hours=2),
        auto_book=False,
    )
    entry = entry_join(user=researcher, want=want)
    open_page(page, asgi_server, researcher, "/waitlist/")
    expect(page.locator("#live-state")).to_have_text("Live")
    expect(page.locator(f"#entry-{entry.pk}")).to_contain_text("live-a100/GPU 0 for 2 h")
    page.evaluate("window.loadedOnce = true")  # gone if the page reloaded

    reservation_cancel(reservation=taken, actor=admin)  # committed: offered to rita, held for her

    offer = page.locator(f".offers #entry-{entry.pk}")
    expect(offer).to_contain_text("Held for you until")
    expect(page.locator("#waitlist-news")).to_contain_text("A slot is on offer to you: live-a100, GPU 0:")
    assert page.evaluate("window.loadedOnce") is True
    screenshot("offer-arrived")

    # Someone else's booking refreshes the page, which changes nothing of hers: the button she is on stays.
    claim = offer.get_by_role("button", name="Claim it")
    claim.focus()
    claim.evaluate("button => { button.kept = true; }")  # a property, not markup: gone if the button is replaced
    refreshes = page.evaluate("Number(document.body.dataset.waitlistRefreshes || 0)")
    reservation_create(user=admin, gpus=[gpus[1]], start=tomorrow_at(14), end=tomorrow_at(15))
    # A function, not an expression: Playwright evaluates an expression with the page's eval(), which the
    # Content-Security-Policy refuses.
    page.wait_for_function("(before) => Number(document.body.dataset.waitlistRefreshes || 0) > before", arg=refreshes)
    assert page.evaluate("document.activeElement.kept") is True
    claim.click()
    expect(page.locator(".messages")).to_contain_text("The slot is yours")
