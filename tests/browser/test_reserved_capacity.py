"""Reserved capacity on the calendar: a non-member sees the shaded band labelled with the group on the reserved
GPU's row, drags over it anyway and is refused in the dialog with the group named; a member books it."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group
from playwright.sync_api import expect

from reservations.models import Reservation, ReservedCapacity
from tests.browser.helpers import drag, log_in, open_tomorrow, save_screenshot, tomorrow_at

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def reserved(alice, node, gpus):
    vision = Group.objects.create(name="vision")
    alice.groups.add(vision)
    window = ReservedCapacity.objects.create(
        group=vision, node=node, start=tomorrow_at(9), end=tomorrow_at(13), label="paper deadline"
    )
    window.gpus.set([gpus[1]])
    ReservedCapacity.objects.create(group=vision, node=node, count=2, start=tomorrow_at(15), end=tomorrow_at(18))
    return window


def test_a_non_member_sees_the_band_and_is_refused_inline_a_member_books(
    browser, live_server, alice, bob, gpus, reserved, screenshot, page
):
    log_in(page, live_server, "bob")
    open_tomorrow(page)

    band = page.locator(".ec-bg-event.reserved", has_text="reserved: vision (paper deadline)")
    expect(band).to_have_count(1)
    expect(band).to_have_attribute("title", "reserved: vision (paper deadline): only its members book here")
    expect(page.locator(".ec-bg-event.reserved", has_text="2 GPUs reserved for vision").first).to_be_visible()
    screenshot("band")
    drag(page, 1, "10:00", "12:00")
    dialog = page.locator("#booking-dialog")
    expect(dialog).to_be_visible()
    dialog.get_by_role("button", name="Book").click()

    error = page.locator("#booking-error")
    expect(error).to_contain_text("GPU 1 on gpu-a100 is reserved for group vision")
    expect(error).to_contain_text("ask a member to book it, or book outside it.")
    expect(dialog).to_be_visible()
    screenshot("refused")
    assert not Reservation.objects.filter(user=bob).exists()

    member = browser.new_context(viewport={"width": 1400, "height": 900})
    try:
        alices = member.new_page()
        log_in(alices, live_server, "alice")
        open_tomorrow(alices)
        drag(alices, 1, "10:00", "12:00")
        alices.locator("#booking-dialog").get_by_role("button", name="Book").click()
        expect(alices.locator("#calendar-status")).to_contain_text("Booked")
        save_screenshot(alices, "test_a_non_member_sees_the_band_and_is_refused_inline_a_member_books-member-booked")
    finally:
        member.close()
    booking = Reservation.objects.get(user=alice)
    assert (booking.start, booking.end) == (tomorrow_at(10), tomorrow_at(12))
