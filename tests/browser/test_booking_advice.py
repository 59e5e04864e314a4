"""Advice in the booking dialog as a person meets it (static/js/slot_advice.js): a slot far longer than the
person's own history says so and offers the length it suggests; a slot in the week's busiest hours offers
quieter free slots, one click takes one into the form; a slot refused as taken offers free slots nearby, and
the one taken from the list books."""

from __future__ import annotations

from datetime import timedelta

import pytest
from playwright.sync_api import expect

from reservations.models import Reservation
from tests.accounting.test_length_advice import past_booking
from tests.browser.helpers import drag, log_in, open_tomorrow, tomorrow_at
from tests.factories import book

pytestmark = pytest.mark.django_db(transaction=True)


def test_length_and_quieter_slots_are_offered_and_taken_into_the_form(page, live_server, alice, bob, gpus, screenshot):
    for days in (2, 3, 4):
        past_booking(alice, gpus[:1], days, 6, 60)  # each GPU busy an hour of each 6-hour booking
    for week in range(1, 9):  # every past week, the whole fleet booked tomorrow's weekday 10:00-12:00
        book(bob, gpus, tomorrow_at(10) - timedelta(weeks=week), tomorrow_at(12) - timedelta(weeks=week), direct=True)
    log_in(page, live_server, "alice")
    open_tomorrow(page)

    drag(page, 0, "10:00", "14:00")
    dialog = page.locator("#booking-dialog")
    length = dialog.locator("#booking-length")
    expect(length).to_contain_text("Your last 3 one-GPU bookings were busy 1.0 h on average (booked 6.0 h)")
    nearby = dialog.locator("#booking-suggestions")
    expect(nearby).to_contain_text("This slot is in the week's busiest hours (busy hour: 100 % of GPUs booked on past")
    offered = nearby.locator("li")
    expect(offered.first).to_contain_text("% of GPUs booked on past")
    nearby.scroll_into_view_if_needed()
    screenshot("busy-slot")

    length.get_by_role("button", name="Book 1 h instead").click()
    expect(dialog.get_by_label("End")).to_have_value(f"{tomorrow_at(11):%Y-%m-%dT%H:%M}")
    expect(length.get_by_role("button")).to_have_count(0)  # the advice for an hour came, the slots with it

    first = offered.first
    first_text = first.locator("button").inner_text()
    first.locator("button").click()
    start = dialog.get_by_label("Start").input_value()
    assert start != f"{tomorrow_at(10):%Y-%m-%dT%H:%M}" and start[11:16] in first_text
    dialog.get_by_role("button", name="Book", exact=True).click()
    expect(dialog).to_be_hidden()
    booked = Reservation.objects.filter(user=alice, start__gt=tomorrow_at(0)).get()
    assert booked.start.strftime("%H:%M") == start[11:16] and booked.allocations.count() == 1


def test_a_refused_slot_offers_free_slots_nearby_and_one_books(page, live_server, alice, bob, gpus, screenshot):
    book(bob, [gpus[0]], tomorrow_at(14), tomorrow_at(16))
    log_in(page, live_server, "alice")
    open_tomorrow(page)

    drag(page, 0, "16:00", "18:00")
    dialog = page.locator("#booking-dialog")
    dialog.get_by_label("Start").fill(f"{tomorrow_at(14):%Y-%m-%dT%H:%M}")
    dialog.get_by_label("End").fill(f"{tomorrow_at(16):%Y-%m-%dT%H:%M}")
    dialog.get_by_role("button", name="Book", exact=True).click()
    expect(dialog.locator("#booking-error")).to_contain_text("Slot taken")
    nearby = dialog.locator("#booking-suggestions")
    expect(nearby).to_contain_text("Free slots nearby:")
    same_time = nearby.locator("li").first
    expect(same_time).to_contain_text("GPU 1")  # the same time on another GPU comes first
    nearby.scroll_into_view_if_needed()
    screenshot("refused")

    same_time.locator("button").click()
    expect(dialog.get_by_label("GPU 1", exact=False).first).to_be_checked()
    dialog.get_by_role("button", name="Book", exact=True).click()
    expect(dialog).to_be_hidden()
    mine = Reservation.objects.get(user=alice)
    assert (mine.start, mine.end) == (tomorrow_at(14), tomorrow_at(16))
    assert [a.gpu.index for a in mine.allocations.all()] == [1]
