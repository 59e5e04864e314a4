"""MIG slices on the calendar (issue 18): a card's slices are rows under it (the demo's MIG card too);
dragging on a slice books that slice; booking the whole card over a booked slice is refused in the dialog,
naming the slice."""

from __future__ import annotations

import re
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from playwright.sync_api import expect

from reservations.models import Reservation
from tests.browser.helpers import drag, log_in, open_page, open_tomorrow, row_head, tomorrow_at
from tests.factories import book, carve_mig

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_slice_is_a_row_under_its_card_and_dragging_on_it_books_it(page, live_server, alice, gpus, screenshot):
    slices = carve_mig(gpus[0])
    log_in(page, live_server, "alice")
    open_tomorrow(page)

    expect(row_head(page, r"^GPU 0 · 3g\.40gb$")).to_be_visible()
    expect(row_head(page, r"^GPU 0 · 2g\.20gb$")).to_have_count(2)
    drag(page, 0, "10:00", "12:00", row=r"^GPU 0 · 3g\.40gb$")
    dialog = page.locator("#booking-dialog")
    expect(dialog).to_be_visible()
    screenshot("slice-dialog")
    dialog.get_by_role("button", name="Book").click()

    expect(dialog).to_be_hidden()
    booking = Reservation.objects.get(user=alice)
    assert (booking.start, booking.end) == (tomorrow_at(10), tomorrow_at(12))
    assert [a.gpu for a in booking.allocations.all()] == [slices[0]]
    screenshot("slice-booked")


def test_booking_the_card_over_a_booked_slice_is_refused_in_the_dialog(page, live_server, alice, bob, gpus, screenshot):
    slices = carve_mig(gpus[0])
    book(bob, [slices[1]], tomorrow_at(10), tomorrow_at(12))
    log_in(page, live_server, "alice")
    open_tomorrow(page)

    # From free time back over bob's slice, on the card's row (its name has no ^: a fold toggle heads the row).
    drag(page, 0, "13:00", "11:00", row=r"GPU 0 · A100")
    dialog = page.locator("#booking-dialog")
    expect(dialog).to_be_visible()
    dialog.get_by_role("button", name="Book").click()

    error = page.locator("#booking-error")
    expect(error).to_contain_text(re.compile(r"slice 2g\.20gb@4 is booked .* by bob"))
    expect(dialog).to_be_visible()
    screenshot("card-over-slice")
    assert not Reservation.objects.filter(user=alice).exists()


def test_the_demos_mig_card_shows_its_slices_as_rows_with_their_bookings(page, live_server, screenshot):
    call_command("demo_lab", stdout=StringIO())
    open_page(page, live_server, get_user_model().objects.get(username="alice"), "/")

    expect(row_head(page, r"^GPU 0 · 3g\.40gb$")).to_have_count(1)
    expect(row_head(page, r"^GPU 0 · 2g\.20gb$")).to_have_count(2)
    # carol's notebook runs on a slice: a block on that slice's row, named.
    expect(page.locator(".run-blocks .block", has_text="carol")).to_have_accessible_name(
        re.compile(r"carol ?: GPU 0 · 2g\.20gb on gpu-a100, carol, ")
    )
    screenshot("demo-mig-card")
