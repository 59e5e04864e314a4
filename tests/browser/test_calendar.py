"""Booking in the calendar as a person does it: drag across the hours of a GPU row, confirm,
see the booking; a conflict is explained in words; release, extend and drag-to-extend work;
an admin approves a pending request and the researcher sees it approved; in a densely booked
week, others' bookings are light blocks that still name the holder and open their details, and
your own still open their actions."""

from __future__ import annotations

import re
from datetime import UTC, datetime, time, timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import Page, expect

from reservations.models import Allocation, Reservation
from reservations.services import reservation_create
from reservations.timegrid import ceil_to_grid
from tests.browser.helpers import (
    block,
    drag,
    first_day,
    log_in,
    open_tomorrow,
    save_screenshot,
    slot_x,
    tomorrow_at,
)
from tests.factories import book, node_with_gpus

pytestmark = pytest.mark.django_db(transaction=True)


def event(page: Page, reservation: Reservation):
    return page.locator(f'.ec-event[data-reservation-id="{reservation.pk}"]').first


def next_week_start() -> datetime:
    """Where "Next week" leads from today: the week view shows seven days from its date, today first."""
    today = timezone.now().astimezone(UTC).date()
    return datetime.combine(today + timedelta(days=7), time(0), tzinfo=UTC)


def book_densely(holders, gpus, start: datetime, days: int = 7) -> list[Reservation]:
    """Two-hour bookings back to back on every GPU for ``days`` days, the holders taken in turn,
    every fifth one pending (written directly, as many as a full lab has)."""
    slots = [start + timedelta(hours=2 * n) for n in range(12 * days)]
    made = Reservation.objects.bulk_create(
        Reservation(
            user=holders[(g + n) % len(holders)],
            node=gpu.node,
            start=slot,
            end=slot + timedelta(hours=2),
            status=Reservation.Status.PENDING if (g + n) % 5 == 4 else Reservation.Status.APPROVED,
            created_by=holders[(g + n) % len(holders)],
        )
        for g, gpu in enumerate(gpus)
        for n, slot in enumerate(slots)
    )
    Allocation.objects.bulk_create(
        Allocation(reservation=booking, gpu=gpu, start=booking.start, end=booking.end).place(gpu)
        for booking, gpu in zip(made, [gpu for gpu in gpus for _ in slots], strict=True)
    )
    return made


def open_next_week(page: Page) -> None:
    page.get_by_role("button", name="Week", exact=True).click()
    expect(page.locator("#calendar")).to_have_attribute("aria-busy", "false")
    page.get_by_role("button", name="Next week").click()
    expect(first_day(page)).to_have_attribute("datetime", f"{next_week_start():%Y-%m-%d}")
    expect(page.locator("#calendar")).to_have_attribute("aria-busy", "false")


def test_the_calendar_opens_on_today_in_the_readers_zone_whatever_the_browsers(browser, live_server, alice, gpus):
    """alice reads UTC. Her laptop is in a zone whose date differs from UTC's right now (11 hours
    behind in the UTC morning, 14 ahead in the afternoon): the calendar still opens on UTC's today."""
    now = timezone.now()
    laptop_zone = "Pacific/Pago_Pago" if now.hour < 11 else "Pacific/Kiritimati"
    context = browser.new_context(timezone_id=laptop_zone, viewport={"width": 1400, "height": 900})
    page = context.new_page()
    try:
        log_in(page, live_server, "alice")
        expect(page.locator("#calendar")).to_have_attribute("aria-busy", "false")
        assert page.evaluate("new Date().getDate()") != now.day  # the laptop's date is another

        expect(first_day(page)).to_have_attribute("datetime", f"{now:%Y-%m-%d}")
    finally:
        context.close()


def test_drag_across_the_hours_of_a_gpu_then_confirm_books_it(page, live_server, alice, gpus, screenshot):
    log_in(page, live_server, "alice")
    open_tomorrow(page)

    drag(page, 1, "10:00", "12:00")
    dialog = page.locator("#booking-dialog")
    expect(dialog).to_be_visible()
    page.locator("#booking-purpose").fill("fine-tuning")
    screenshot("dialog")
    dialog.get_by_role("button", name="Book").click()

    expect(dialog).to_be_hidden()
    expect(page.locator("#calendar-status")).to_contain_text("Booked")
    booking = Reservation.objects.get(user=alice)
    assert (booking.start, booking.end) == (tomorrow_at(10), tomorrow_at(12))
    assert [a.gpu.index for a in booking.allocations.all()] == [1]
    assert booking.purpose == "fine-tuning"
    expect(event(page, booking)).to_contain_text("alice")
    screenshot("booked")


def test_a_conflicting_selection_shows_the_conflict_and_books_nothing(page, live_server, alice, bob, gpus, screenshot):
    reservation_create(user=bob, gpus=[gpus[1]], start=tomorrow_at(10), end=tomorrow_at(12))
    log_in(page, live_server, "alice")
    open_tomorrow(page)

    # Bob's booking is a block on GPU 1's row that says when and whose it is.
    bobs = page.locator(".run-blocks .block", has_text="bob")
    expect(bobs).to_have_text("10:00 bob")
    expect(bobs).to_have_accessible_name(
        re.compile(r"^10:00 bob ?: GPU 1 · .* on gpu-a100, bob, .*10:00 to 12:00, approved$")
    )
    drag(page, 1, "11:00", "13:00", backwards=True)  # 11:00-12:00 is bob's
    dialog = page.locator("#booking-dialog")
    expect(dialog).to_be_visible()
    dialog.get_by_role("button", name="Book").click()

    error = page.locator("#booking-error")
    expect(error).to_contain_text(re.compile(r"is booked .* by bob"))
    expect(dialog).to_be_visible()  # still open, so the person can change the slot
    screenshot("conflict")
    assert not Reservation.objects.filter(user=alice).exists()


def test_release_and_extend_a_running_booking(page, live_server, alice, gpus, screenshot):
    now = timezone.now().replace(microsecond=0)
    # Started a minute ago, ending on the booking grid: written directly, as the rules forbid booking the past.
    booking = book(alice, [gpus[0]], now - timedelta(minutes=1), ceil_to_grid(now + timedelta(hours=2)), direct=True)
    end = booking.end
    log_in(page, live_server, "alice")

    event(page, booking).click()
    dialog = page.locator("#reservation-dialog")
    expect(dialog).to_be_visible()
    screenshot("details")
    dialog.get_by_role("button", name="+1 hour").click()
    expect(page.locator("#calendar-status")).to_contain_text(re.compile(rf"Booking #{booking.pk}\b.* now ends"))
    booking.refresh_from_db()
    assert booking.end == end + timedelta(hours=1)

    event(page, booking).click()
    expect(dialog).to_be_visible()
    dialog.get_by_role("button", name="Release now").click()
    expect(page.locator("#calendar-status")).to_contain_text(f"Booking #{booking.pk} released")
    booking.refresh_from_db()
    assert booking.released_at is not None and booking.end <= timezone.now() + timedelta(seconds=1)


def test_dragging_the_end_of_an_own_booking_extends_it(page, live_server, alice, gpus):
    booking = reservation_create(user=alice, gpus=[gpus[2]], start=tomorrow_at(10), end=tomorrow_at(11))
    log_in(page, live_server, "alice")
    open_tomorrow(page)

    box = event(page, booking).bounding_box()
    resizer_x, y = box["x"] + box["width"] - 2, box["y"] + box["height"] / 2
    target = slot_x(page, "13:00") - 2
    page.mouse.move(resizer_x, y)
    page.mouse.down()
    page.mouse.move(target, y, steps=8)
    page.mouse.up()

    expect(page.locator("#calendar-status")).to_contain_text(re.compile(rf"Booking #{booking.pk}\b.* now ends"))
    booking.refresh_from_db()
    assert booking.end == tomorrow_at(13)


def test_your_booking_waiting_for_approval_offers_no_extension(page, live_server, alice, node, gpus):
    """Issue 37: the admin approves the slot they saw, so a pending booking's end cannot be dragged (it is a block,
    not an event) and its dialog offers cancelling, not extending."""
    node.requires_approval = True
    node.save()
    pending = reservation_create(user=alice, gpus=[gpus[0]], start=tomorrow_at(10), end=tomorrow_at(11))
    log_in(page, live_server, "alice")
    open_tomorrow(page)

    expect(event(page, pending)).to_have_count(0)
    block(page, pending).click()
    dialog = page.locator("#reservation-dialog")
    expect(dialog.get_by_role("heading")).to_have_text(f"Your booking #{pending.pk}")
    expect(dialog.get_by_role("button", name="Cancel booking")).to_be_visible()
    expect(dialog.get_by_role("button", name="+1 hour")).to_be_hidden()
    expect(dialog.get_by_role("button", name="Extend to this end")).to_be_hidden()
    pending.refresh_from_db()
    assert (pending.status, pending.end) == (Reservation.Status.PENDING, tomorrow_at(11))


def test_an_admin_approves_a_pending_request_and_the_researcher_sees_it(browser, live_server, alice, carol, node, gpus):
    node.requires_approval = True
    node.save()
    pending = reservation_create(user=alice, gpus=[gpus[0]], start=tomorrow_at(10), end=tomorrow_at(12))
    assert pending.status == Reservation.Status.PENDING

    admin = browser.new_page()
    log_in(admin, live_server, "carol")
    admin.get_by_role("link", name="Approvals").click()
    admin.get_by_role("button", name=f"Approve #{pending.pk}").click()
    expect(admin.locator(".messages")).to_contain_text("approved")

    researcher = browser.new_page()
    log_in(researcher, live_server, "alice")
    researcher.get_by_role("link", name="My reservations").click()
    row = researcher.locator("tr", has_text=f"#{pending.pk}")
    expect(row).to_contain_text("approved")
    save_screenshot(researcher, "admin-approval-seen-by-researcher")
    pending.refresh_from_db()
    assert pending.status == Reservation.Status.APPROVED


def test_in_a_dense_week_others_bookings_are_blocks_that_name_the_holder_and_open_their_details(
    page, live_server, alice, bob, gpus, screenshot
):
    made = book_densely([bob, bob, alice], gpus, next_week_start())
    third_noon = next_week_start() + timedelta(days=2, hours=12)
    bobs = [b for b in made if b.user == bob and b.start >= third_noon]
    approved = next(b for b in bobs if b.status == Reservation.Status.APPROVED)
    pending = next(b for b in bobs if b.status == Reservation.Status.PENDING)
    log_in(page, live_server, "alice")
    open_next_week(page)
    screenshot("dense-week")

    # Others' bookings are blocks, not calendar events, and still say whose they are.
    expect(page.locator(f'.ec-event[data-reservation-id="{approved.pk}"]')).to_have_count(0)
    expect(block(page, approved)).to_have_text("bob")
    expect(block(page, approved)).to_have_accessible_name(re.compile(r"^bob ?: GPU \d · .* on gpu-a100, bob, "))
    expect(block(page, approved)).to_have_attribute("role", "button")
    expect(block(page, pending)).to_have_class(re.compile(r"\bpending\b"))
    expect(block(page, pending)).to_have_accessible_name(re.compile(r"pending approval$"))

    block(page, approved).click()
    dialog = page.locator("#reservation-dialog")
    expect(dialog.get_by_role("heading")).to_have_text("Booked by bob")
    expect(dialog.locator("#reservation-actions")).to_be_hidden()
    screenshot("others-details")
    dialog.get_by_role("button", name="Close").click()
    expect(dialog).to_be_hidden()

    # From the keyboard: Enter on a focused block opens it too.
    block(page, pending).focus()
    page.keyboard.press("Enter")
    expect(dialog.get_by_role("heading")).to_have_text("Booked by bob")
    expect(dialog).to_contain_text("Pending approval")


def test_in_a_dense_week_your_own_booking_opens_its_actions(page, live_server, alice, bob, gpus, screenshot):
    made = book_densely([bob, bob, alice], gpus, next_week_start())
    own = next(b for b in made if b.user == alice and b.status == Reservation.Status.APPROVED)
    log_in(page, live_server, "alice")
    open_next_week(page)

    # Yours stay calendar events (so their end can be dragged), in your colour.
    expect(event(page, own)).to_have_class(re.compile(r"\bmine\b"))
    event(page, own).click()
    dialog = page.locator("#reservation-dialog")
    expect(dialog.get_by_role("heading")).to_have_text(f"Your booking #{own.pk}")
    expect(dialog.get_by_role("button", name="Cancel booking")).to_be_visible()
    expect(dialog.get_by_role("button", name="+1 hour")).to_be_visible()
    screenshot("own-actions")
    dialog.get_by_role("button", name="Cancel booking").click()
    expect(page.locator("#calendar-status")).to_contain_text(f"Booking #{own.pk} cancelled")
    expect(event(page, own)).to_have_count(0)
    own.refresh_from_db()
    assert own.status == Reservation.Status.CANCELLED


def test_in_a_crowded_week_rows_far_out_of_view_get_their_blocks_when_scrolled_to(
    page, live_server, alice, bob, gpus, screenshot
):
    lab = gpus + [gpu for n in range(4) for gpu in node_with_gpus(8, name=f"gpu-h100-{n}").gpus.order_by("index")]
    made = book_densely([bob, bob, alice], lab, next_week_start())  # 36 GPUs: 3,024 bookings
    last_row = next(b for b in reversed(made) if b.user == bob)
    log_in(page, live_server, "alice")
    open_next_week(page)
    expect(block(page, made[0])).to_have_text("bob")  # the first row is in view
    expect(block(page, last_row)).to_have_count(0)  # the last is far below: not built yet

    page.locator(".ec-main").evaluate("main => { main.scrollTop = main.scrollHeight; }")
    expect(block(page, last_row)).to_have_text("bob")
    screenshot("scrolled-down")
