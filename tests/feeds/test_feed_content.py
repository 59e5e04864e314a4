"""What the feeds say, read by an independent parser (vobject): which events, their times and zones,
their state, and private details only in the subscriber's own bookings."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from reservations.models import Reservation
from reservations.services import (
    reservation_approve,
    reservation_cancel,
    reservation_extend,
    reservation_reject,
    reservation_release,
)
from tests.conftest import at
from tests.factories import UserFactory, book, node_with_gpus
from waitlist.services import Want, entry_join, offer_claim

from .conftest import event_of, events, feed_path, fetch, instant, parse, read_feed, text

pytestmark = pytest.mark.usefixtures("clock")


# --- which events -----------------------------------------------------------------------------


def test_own_feed_has_only_the_users_bookings_on_every_node(alice, bob, node, gpus):
    other_node = node_with_gpus(2, name="gpu-h100")
    mine = book(alice, gpus[:2], at(1), at(3), purpose="training")
    mine_elsewhere = book(alice, list(other_node.gpus.all())[:1], at(2), at(4))
    book(bob, gpus[2:3], at(1), at(3), purpose="bob's secret")

    calendar = read_feed(alice)

    assert set(events(calendar)) == {f"reservation-{mine.pk}@testserver", f"reservation-{mine_elsewhere.pk}@testserver"}
    assert text(event_of(calendar, mine), "summary") == "gpu-a100: GPU 0, 1"
    assert text(event_of(calendar, mine_elsewhere), "summary") == "gpu-h100: GPU 0"
    assert calendar.x_wr_calname.value == "My GPU bookings"
    assert "bob" not in calendar.serialize()


def test_node_feed_has_everyones_bookings_on_that_node_only(alice, bob, node, gpus):
    other_node = node_with_gpus(1, name="gpu-h100")
    mine = book(alice, gpus[:2], at(1), at(3))
    bobs = book(bob, gpus[2:4], at(1), at(3))
    book(bob, list(other_node.gpus.all()), at(1), at(3))

    calendar = read_feed(alice, node)

    assert set(events(calendar)) == {f"reservation-{mine.pk}@testserver", f"reservation-{bobs.pk}@testserver"}
    assert text(event_of(calendar, bobs), "summary") == "GPU 2, 3 on gpu-a100 — bob"
    assert text(event_of(calendar, mine), "summary") == "GPU 0, 1 on gpu-a100 — alice"
    assert calendar.x_wr_calname.value == "GPU bookings on gpu-a100"


def test_the_window_is_30_days_back_and_90_ahead(alice, gpus, clock, settings):
    settings.MAX_DAYS_AHEAD = 365  # the site ceiling is not what this is about: a booking 100 days ahead
    clock.move_to(at(days=-45))
    too_old = book(alice, gpus[:1], at(days=-40), at(days=-40, hours=2))
    recent = book(alice, gpus[:1], at(days=-20), at(days=-20, hours=2))
    clock.move_to(at())
    soon = book(alice, gpus[:1], at(days=80), at(days=80, hours=2))
    too_far = book(alice, gpus[:1], at(days=100), at(days=100, hours=2))

    uids = set(events(read_feed(alice)))

    assert f"reservation-{recent.pk}@testserver" in uids
    assert f"reservation-{soon.pk}@testserver" in uids
    assert f"reservation-{too_old.pk}@testserver" not in uids
    assert f"reservation-{too_far.pk}@testserver" not in uids

    settings.FEED_FUTURE_DAYS = 120
    assert f"reservation-{too_far.pk}@testserver" in set(events(read_feed(alice)))


# --- state ------------------------------------------------------------------------------------


def test_pending_bookings_are_tentative_until_approved(alice, carol, node, gpus):
    pending = book(alice, gpus[:1], at(1), at(2), pending=True)

    event = event_of(read_feed(alice), pending)
    assert text(event, "status") == "TENTATIVE"
    assert text(event, "summary") == "gpu-a100: GPU 0 (pending approval)"
    assert text(event, "sequence") == "0"
    assert "pending approval" in text(event, "description")
    assert "ssh" not in text(event, "description")  # no access before approval
    assert text(event_of(read_feed(carol, node), pending), "status") == "TENTATIVE"

    reservation_approve(reservation=pending, actor=carol)

    event = event_of(read_feed(alice), pending)
    assert text(event, "status") == "CONFIRMED"
    assert text(event, "summary") == "gpu-a100: GPU 0"
    assert int(text(event, "sequence")) == 1
    assert "ssh alice@" in text(event, "description")


def test_a_slot_offered_from_the_waitlist_is_tentative_until_claimed(
    alice, bob, node, gpus, django_capture_on_commit_callbacks
):
    taken = book(bob, gpus[:1], at(1), at(3))
    want = Want(gpus=gpus[:1], earliest_start=at(1), latest_end=at(3), duration=timedelta(hours=2), auto_book=False)
    entry = entry_join(user=alice, want=want)
    with django_capture_on_commit_callbacks(execute=True):  # the offer is made once the cancel commits
        reservation_cancel(reservation=taken, actor=bob)
    entry.refresh_from_db()
    offer = entry.reservation
    assert offer.status == Reservation.Status.OFFERED

    event = event_of(read_feed(alice), offer)
    assert text(event, "status") == "TENTATIVE"
    assert text(event, "summary") == "gpu-a100: GPU 0 (offered from the waitlist)"
    assert "claim or decline it on your waitlist" in text(event, "description")
    assert text(event_of(read_feed(bob, node), offer), "status") == "TENTATIVE"

    offer_claim(entry=entry, actor=alice)
    assert text(event_of(read_feed(alice), offer), "status") == "CONFIRMED"


def test_cancelled_and_rejected_bookings_stay_as_cancelled_events_with_a_higher_sequence(alice, bob, carol, node, gpus):
    cancelled = book(alice, gpus[:1], at(1), at(2))
    rejected = book(bob, gpus[1:2], at(1), at(2), purpose="bob's plan", pending=True)
    before = event_of(read_feed(alice), cancelled)

    reservation_cancel(reservation=cancelled, actor=alice)
    reservation_reject(reservation=rejected, actor=carol, reason="not this week")

    mine = event_of(read_feed(alice), cancelled)
    assert text(mine, "status") == "CANCELLED"
    assert text(mine, "summary") == "gpu-a100: GPU 0 (cancelled)"
    assert int(text(mine, "sequence")) > int(text(before, "sequence"))
    assert instant(mine, "dtstamp") >= instant(before, "dtstamp")
    assert text(mine, "transp") == "TRANSPARENT"

    node_feed = read_feed(alice, node)
    bobs = event_of(node_feed, rejected)
    assert text(bobs, "status") == "CANCELLED"
    # Others' dead bookings are not on the calendar page; the feed keeps the event so calendars drop
    # it, but not whose it was.
    assert text(bobs, "summary") == "GPU 1 on gpu-a100 (rejected)"
    assert "bob" not in node_feed.serialize()
    assert text(event_of(read_feed(bob), rejected), "summary") == "gpu-a100: GPU 1 (rejected)"


def test_release_and_extension_change_the_end_and_the_sequence(alice, gpus, clock):
    extended = book(alice, gpus[:1], at(1), at(2))
    released = book(alice, gpus[1:2], at(1), at(5))
    reservation_extend(reservation=extended, actor=alice, end=at(3))
    clock.move_to(at(2))
    reservation_release(reservation=released, actor=alice)

    calendar = read_feed(alice)

    assert instant(event_of(calendar, extended), "dtend") == at(3)
    assert int(text(event_of(calendar, extended), "sequence")) == 1
    event = event_of(calendar, released)
    assert text(event, "status") == "CONFIRMED"
    assert instant(event, "dtend") == at(2)
    assert int(text(event, "sequence")) == 1
    assert "released" in text(event, "description")


# --- times and zones --------------------------------------------------------------------------


def test_times_are_exact_instants_across_new_yorks_dst_change(gpus):
    """US clocks go forward on Sunday 10 March 2030 at 02:00: 09:00 there is 14:00 UTC before, 13:00 after."""
    ny = ZoneInfo("America/New_York")
    nina = UserFactory(username="nina", timezone="America/New_York")
    before = book(nina, gpus[:1], datetime(2030, 3, 8, 9, tzinfo=ny), datetime(2030, 3, 8, 11, tzinfo=ny))
    after = book(nina, gpus[:1], datetime(2030, 3, 11, 9, tzinfo=ny), datetime(2030, 3, 11, 11, tzinfo=ny))
    overnight = book(nina, gpus[1:2], datetime(2030, 3, 9, 22, tzinfo=ny), datetime(2030, 3, 10, 4, tzinfo=ny))

    calendar = read_feed(nina)

    assert calendar.x_wr_timezone.value == "America/New_York"
    assert instant(event_of(calendar, before), "dtstart") == datetime(2030, 3, 8, 14, tzinfo=UTC)
    assert instant(event_of(calendar, after), "dtstart") == datetime(2030, 3, 11, 13, tzinfo=UTC)
    for reservation in (before, after):
        local = instant(event_of(calendar, reservation), "dtstart").astimezone(ny)
        assert (local.hour, local.minute) == (9, 0)
    # 22:00 EST to 04:00 EDT is five hours, not six.
    event = event_of(calendar, overnight)
    assert instant(event, "dtend") - instant(event, "dtstart") == timedelta(hours=5)
    assert "From Fri 8 Mar 2030, 09:00 EST to Fri 8 Mar 2030, 11:00 EST (America/New_York)." in text(
        event_of(calendar, before), "description"
    )
    assert "From Mon 11 Mar 2030, 09:00 EDT" in text(event_of(calendar, after), "description")
    assert "From Sat 9 Mar 2030, 22:00 EST to Sun 10 Mar 2030, 04:00 EDT" in text(event, "description")


def test_each_subscriber_gets_their_own_zone_for_the_same_bookings(node, gpus):
    """Europe moves on Sunday 31 March 2030: 09:00 in Berlin is 08:00 UTC before, 07:00 after."""
    berlin = ZoneInfo("Europe/Berlin")
    bea = UserFactory(username="bea", timezone="Europe/Berlin")
    nina = UserFactory(username="nina", timezone="America/New_York")
    before = book(bea, gpus[:1], datetime(2030, 3, 29, 9, tzinfo=berlin), datetime(2030, 3, 29, 10, tzinfo=berlin))
    after = book(bea, gpus[:1], datetime(2030, 4, 1, 9, tzinfo=berlin), datetime(2030, 4, 1, 10, tzinfo=berlin))

    beas = read_feed(bea)
    ninas = read_feed(nina, node)

    assert beas.x_wr_timezone.value == "Europe/Berlin"
    assert ninas.x_wr_timezone.value == "America/New_York"
    assert instant(event_of(beas, before), "dtstart") == datetime(2030, 3, 29, 8, tzinfo=UTC)
    assert instant(event_of(beas, after), "dtstart") == datetime(2030, 4, 1, 7, tzinfo=UTC)
    # The same instants in the other subscriber's feed: a zone changes how times are shown, never when.
    for reservation in (before, after):
        assert instant(event_of(ninas, reservation), "dtstart") == instant(event_of(beas, reservation), "dtstart")
    expected = "From Mon 1 Apr 2030, 09:00 CEST to Mon 1 Apr 2030, 10:00 CEST (Europe/Berlin)."
    assert expected in text(event_of(beas, after), "description")


# --- who sees what ----------------------------------------------------------------------------


def test_purpose_host_and_gpu_ids_only_in_the_subscribers_own_bookings(alice, bob, carol, node, gpus):
    alices = book(alice, gpus[:2], at(1), at(3), purpose="fine-tune llama")
    bobs = book(bob, gpus[2:3], at(1), at(3), purpose="bob's secret project")

    own = event_of(read_feed(alice), alices)
    description = text(own, "description")
    assert "Purpose: fine-tune llama" in description
    assert f"ssh alice@{node.hostname}" in description
    assert f"export CUDA_VISIBLE_DEVICES={gpus[0].uuid},{gpus[1].uuid}" in description
    assert "CUDA_VISIBLE_DEVICES=0,1" in description
    assert text(own, "location") == f"gpu-a100 ({node.hostname})"
    assert text(own, "url") == "http://testserver/reservations/mine/"

    for subscriber in (alice, carol):  # admins too: a feed URL travels to calendar providers
        node_feed = read_feed(subscriber, node)
        serialized = node_feed.serialize()
        assert "bob's secret project" not in serialized
        assert gpus[2].uuid not in serialized
        others = event_of(node_feed, bobs)
        assert text(others, "description") == "Booked by bob. The calendar: http://testserver/"
        assert text(others, "location") == "gpu-a100"
        assert text(others, "url") == "http://testserver/"
    assert "fine-tune llama" in text(event_of(read_feed(alice, node), alices), "description")
    assert "fine-tune llama" not in read_feed(bob, node).serialize()


def test_a_user_without_unix_username_is_told_to_set_it(gpus):
    dana = UserFactory(username="dana")
    booking = book(dana, gpus[:1], at(1), at(2))
    type(dana).objects.filter(pk=dana.pk).update(unix_username=None)  # an admin cleared it

    description = text(event_of(read_feed(dana), booking), "description")

    assert "ssh" not in description
    assert "Set your unix username" in description


# --- the calendar itself ----------------------------------------------------------------------


def test_calendar_properties_for_subscriptions(alice, gpus):
    booking = book(alice, gpus[:1], at(1), at(2))
    response = fetch(feed_path(alice))
    body = response.content.decode()
    calendar = parse(response)

    assert body.startswith("BEGIN:VCALENDAR\r\n")
    assert calendar.version.value == "2.0"
    assert calendar.prodid.value == "-//GPU booking portal//Calendar feeds//EN"
    assert "REFRESH-INTERVAL;VALUE=DURATION:PT1H\r\n" in body
    assert "X-PUBLISHED-TTL:PT1H\r\n" in body
    assert "DTSTART:20300107T100000Z\r\n" in body  # UTC instants, no VTIMEZONE needed
    event = event_of(calendar, booking)
    assert instant(event, "dtstamp") == at()  # the last change, here the booking itself
    assert instant(event, "dtend") == at(2)
    assert response["Content-Disposition"] == 'inline; filename="my-gpu-bookings.ics"'


def test_the_query_count_does_not_grow_with_the_number_of_bookings(alice, bob, node, gpus, django_assert_num_queries):
    book(alice, gpus[:1], at(1), at(2))
    path = feed_path(alice, node)
    with django_assert_num_queries(4) as one:  # the user, the node, the bookings, their GPUs
        parse(fetch(path))
    for day in range(1, 15):
        book(alice if day % 2 else bob, gpus[day % 4 : day % 4 + 1], at(1, days=day), at(2, days=day))
    with django_assert_num_queries(len(one.captured_queries)):
        calendar = parse(fetch(path))
    assert len(events(calendar)) == 15
