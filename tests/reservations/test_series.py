"""Recurring bookings (reservations/series.py): the wall-clock time across DST, conflicts in both modes,
limits counted across occurrences, occurrences beyond reach booked later, cancel and edit scopes."""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from zoneinfo import ZoneInfo

import pytest
from django.db import connection

from reservations.exceptions import InvalidBooking, NotAllowed, SlotConflict
from reservations.models import Limit, MaintenanceWindow, Reservation, Series
from reservations.series import (
    BOOKABLE,
    BOOKED,
    HELD_BACK,
    LATER,
    REFUSED,
    SeriesRefused,
    series_book_due,
    series_book_within_reach,
    series_cancel,
    series_create,
    series_edit,
    series_occurrences,
)
from tests.conftest import at
from tests.factories import book

BERLIN, NEW_YORK = ZoneInfo("Europe/Berlin"), ZoneInfo("America/New_York")
Status = Reservation.Status


def local(zone: ZoneInfo, *args: int) -> datetime:
    return datetime(*args, tzinfo=zone)


def walls(reservations, zone):
    return [
        (r.start.astimezone(zone).strftime("%m-%d %H:%M"), r.end.astimezone(zone).strftime("%H:%M"))
        for r in reservations
    ]


@pytest.fixture
def far(settings):
    """Book far enough ahead for a series across both DST changes."""
    settings.MAX_DAYS_AHEAD = 400


@pytest.mark.parametrize(
    ("zone", "spring", "autumn"),
    [(BERLIN, date(2030, 3, 31), date(2030, 10, 27)), (NEW_YORK, date(2030, 3, 10), date(2030, 11, 3))],
)
def test_weekly_series_keeps_the_wall_clock_time_across_both_dst_changes(alice, gpus, clock, far, zone, spring, autumn):
    # Sundays (the DST changes fall on Sundays in both zones), 09:00-13:00 local, from January to December.
    report = series_create(
        user=alice,
        gpus=[gpus[0]],
        start=local(zone, 2030, 1, 13, 9),
        end=local(zone, 2030, 1, 13, 13),
        rule="FREQ=WEEKLY;BYDAY=SU;UNTIL=20301215",
        zone=zone.key,
    )
    booked = [o.reservation for o in report.occurrences]
    assert report.count(BOOKED) == len(booked) == 49
    assert {wall for wall in walls(booked, zone)} == {
        (f"{r.start.astimezone(zone):%m-%d} 09:00", "13:00") for r in booked
    }
    by_day = {o.day: o.reservation for o in report.occurrences}
    # The UTC time moves by the hour DST shifts, the wall time does not.
    before, after = by_day[spring - timedelta(days=7)], by_day[spring]
    assert after.start - before.start == timedelta(days=7, hours=-1)
    back = by_day[autumn]
    assert back.start - by_day[autumn - timedelta(days=7)].start == timedelta(days=7, hours=1)
    assert all(r.end - r.start == timedelta(hours=4) for r in booked)
    assert all(r.series_id == report.series.pk and r.series_day == r.start.astimezone(zone).date() for r in booked)


def test_a_wall_time_skipped_in_spring_moves_forward_and_a_repeated_one_is_the_first(alice, gpus, clock, far):
    spring = series_create(
        user=alice,
        gpus=[gpus[0]],
        start=local(BERLIN, 2030, 3, 30, 2, 30),
        end=local(BERLIN, 2030, 3, 30, 3, 30),
        rule="FREQ=DAILY;COUNT=3",
        zone="Europe/Berlin",
    )
    skipped = spring.occurrences[1]
    assert skipped.day == date(2030, 3, 31)
    assert skipped.start.astimezone(BERLIN).strftime("%H:%M %Z") == "03:30 CEST"
    assert skipped.end - skipped.start == timedelta(hours=1)
    assert "does not exist" in skipped.note
    autumn = series_create(
        user=alice,
        gpus=[gpus[1]],
        start=local(BERLIN, 2030, 10, 26, 2, 30),
        end=local(BERLIN, 2030, 10, 26, 3, 0),
        rule="FREQ=DAILY;COUNT=3",
        zone="Europe/Berlin",
    )
    twice = autumn.occurrences[1]
    assert twice.start.astimezone(BERLIN).strftime("%H:%M %Z") == "02:30 CEST"  # the first of the two
    assert "happens twice" in twice.note


def test_all_or_nothing_writes_nothing_and_names_the_refused_occurrences(alice, bob, gpus, clock):
    taken = book(bob, [gpus[0]], at(days=7), at(days=7, hours=2))
    MaintenanceWindow.objects.create(node=gpus[0].node, start=at(days=14), end=at(days=14, hours=1), reason="PSU")
    with pytest.raises(SeriesRefused) as refused:
        series_create(user=alice, gpus=[gpus[0]], start=at(), end=at(hours=2), rule="FREQ=WEEKLY;COUNT=4", zone="UTC")
    assert "2 of 4 occurrences cannot be booked, so none was" in refused.value.message
    outcomes = [(o["day"], o["outcome"], o["code"]) for o in refused.value.details["occurrences"]]
    assert outcomes == [
        ("2030-01-07", HELD_BACK, ""),
        ("2030-01-14", REFUSED, "slot_conflict"),
        ("2030-01-21", REFUSED, "maintenance"),
        ("2030-01-28", HELD_BACK, ""),
    ]
    slot_taken = refused.value.details["occurrences"][1]["message"]
    assert slot_taken.startswith("Slot taken:") and f"reservation #{taken.pk}" in slot_taken
    assert "PSU" in refused.value.details["occurrences"][2]["message"]
    assert not Series.objects.exists()
    assert Reservation.objects.filter(user=alice).count() == 0


def test_skip_conflicts_books_the_rest_and_reports_the_skipped(alice, bob, gpus, clock):
    book(bob, [gpus[0]], at(days=7), at(days=7, hours=2))
    report = series_create(
        user=alice, gpus=[gpus[0]], start=at(), end=at(hours=2), rule="FREQ=WEEKLY;COUNT=4", zone="UTC", mode="skip"
    )
    assert [o.outcome for o in report.occurrences] == [BOOKED, REFUSED, BOOKED, BOOKED]
    assert report.occurrences[1].message.startswith("Slot taken: ")
    assert Reservation.objects.filter(series=report.series, status=Status.APPROVED).count() == 3
    assert report.summary == "3 of 4 occurrences were booked, 1 refused."


def test_preview_writes_nothing_and_says_what_booking_would_do(alice, bob, gpus, clock):
    book(bob, [gpus[0]], at(days=1), at(days=1, hours=2))
    report = series_create(
        user=alice, gpus=[gpus[0]], start=at(), end=at(hours=2), rule="FREQ=DAILY;COUNT=3", zone="UTC", preview=True
    )
    assert [o.outcome for o in report.occurrences] == [BOOKABLE, REFUSED, BOOKABLE]
    assert report.series is None
    assert not Series.objects.exists() and Reservation.objects.filter(user=alice).count() == 0


def test_the_weekly_limit_counts_each_weeks_occurrences(alice, gpus, clock):
    Limit.objects.create(scope=Limit.Scope.USER, user=alice, weekly_gpu_hours=Decimal(10))
    # 4 GPU-hours each weekday for two weeks, at most 10 in any rolling 7 days: two days in a row fit, a
    # third is refused, and the next Monday fits again (no 7 days hold it with both of the week before).
    report = series_create(
        user=alice,
        gpus=[gpus[0]],
        start=at(),
        end=at(hours=4),
        rule="FREQ=WEEKLY;BYDAY=MO,TU,WE,TH,FR;COUNT=10",
        zone="UTC",
        mode="skip",
    )
    outcomes = {o.day.day: o.outcome for o in report.occurrences}
    assert outcomes == {
        7: BOOKED, 8: BOOKED, 9: REFUSED, 10: REFUSED, 11: REFUSED,
        14: BOOKED, 15: BOOKED, 16: REFUSED, 17: REFUSED, 18: REFUSED,
    }  # fmt: skip
    assert "weekly GPU-hours: 8 used + 4 asked > 10 allowed" in report.occurrences[2].message
    # Wednesday the 16th: the 7 days from Monday the 14th hold Monday and Tuesday, which the series booked.
    assert "weekly GPU-hours: 8 used + 4 asked > 10 allowed" in report.occurrences[7].message
    assert Reservation.objects.filter(series=report.series, status=Status.APPROVED).count() == 4


def test_occurrences_beyond_the_horizon_are_later_and_booked_when_within_reach(alice, gpus, clock):
    Limit.objects.create(scope=Limit.Scope.USER, user=alice, max_days_ahead=10)
    report = series_create(
        user=alice, gpus=[gpus[0]], start=at(), end=at(hours=2), rule="FREQ=WEEKLY;COUNT=4", zone="UTC"
    )
    assert [o.outcome for o in report.occurrences] == [BOOKED, BOOKED, LATER, LATER]
    assert report.occurrences[2].code == "limit_exceeded" and "days ahead" in report.occurrences[2].message
    series = report.series
    assert [row["state"] for row in series_occurrences(series)] == ["approved", "approved", "not_booked", "not_booked"]

    clock.shift(timedelta(days=7))
    again = series_book_within_reach(series=series, actor=alice)
    assert [(o.day, o.outcome) for o in again.occurrences] == [(date(2030, 1, 21), BOOKED), (date(2030, 1, 28), LATER)]
    clock.shift(timedelta(days=7))
    assert series_book_due() == 1
    assert series.occurrences.filter(status=Status.APPROVED).count() == 4


def test_cancel_one_following_or_all(alice, gpus, clock):
    report = series_create(
        user=alice, gpus=[gpus[0]], start=at(hours=1), end=at(hours=2), rule="FREQ=DAILY;COUNT=6", zone="UTC"
    )
    series, occurrences = report.series, [o.reservation for o in report.occurrences]
    from reservations.services import reservation_cancel

    reservation_cancel(reservation=occurrences[1], actor=alice)  # one occurrence, the normal way
    cancelled = series_cancel(series=series, actor=alice, scope="following", from_day=date(2030, 1, 11))
    assert sorted(r.series_day.day for r in cancelled) == [11, 12]
    states = [row["state"] for row in series_occurrences(series)]
    assert states == ["approved", "cancelled", "approved", "approved", "cancelled", "cancelled"]
    # Cancelling one occurrence is not undone by booking what is within reach.
    assert series_book_within_reach(series=series, actor=alice).occurrences == []
    series_cancel(series=series, actor=alice, scope="all")
    assert not series.occurrences.filter(status__in=Reservation.LIVE_STATUSES).exists()


def test_edit_following_moves_the_time_and_all_or_nothing_leaves_it_unchanged(alice, bob, gpus, clock):
    report = series_create(
        user=alice, gpus=[gpus[0]], start=at(hours=1), end=at(hours=2), rule="FREQ=DAILY;COUNT=4", zone="UTC"
    )
    series = report.series
    book(bob, [gpus[0]], at(days=3, hours=4), at(days=3, hours=5))
    with pytest.raises(SeriesRefused):
        series_edit(series=series, actor=alice, from_day=date(2030, 1, 9), start_time=time(13))
    assert walls(series.occurrences.filter(status=Status.APPROVED).order_by("start"), UTC) == [
        ("01-07 10:00", "11:00"),
        ("01-08 10:00", "11:00"),
        ("01-09 10:00", "11:00"),
        ("01-10 10:00", "11:00"),
    ]
    edited = series_edit(series=series, actor=alice, from_day=date(2030, 1, 9), start_time=time(12), mode="skip")
    assert [o.outcome for o in edited.occurrences] == [BOOKED, BOOKED]
    assert walls(series.occurrences.filter(status=Status.APPROVED).order_by("start"), UTC) == [
        ("01-07 10:00", "11:00"),
        ("01-08 10:00", "11:00"),
        ("01-09 12:00", "13:00"),
        ("01-10 12:00", "13:00"),
    ]
    preview = series_edit(series=series, actor=alice, duration=timedelta(hours=3), preview=True)
    assert preview.preview and series.occurrences.filter(status=Status.CANCELLED).count() == 2


@pytest.mark.parametrize(
    ("rule", "zone", "words"),
    [
        ("FREQ=DAILY", "UTC", "must end: add UNTIL"),
        ("FREQ=HOURLY;COUNT=3", "UTC", "repeats more than once a day"),
        ("FREQ=DAILY;BYHOUR=9,10;COUNT=3", "UTC", "BYHOUR would repeat within a day"),
        ("FREQ=DAILY;COUNT=500", "UTC", "more than 200 occurrences"),
        ("FREQ=WEEKLY;BYDAY=XX;COUNT=2", "UTC", "not valid RFC 5545"),
        ("FREQ=DAILY;UNTIL=2029", "UTC", "is not a date"),
        ("FREQ=DAILY;COUNT=3", "Mars/Olympus", "Unknown time zone 'Mars/Olympus'"),
    ],
)
def test_bad_rules_and_zones_are_refused_with_words(alice, gpus, clock, rule, zone, words):
    with pytest.raises(InvalidBooking, match=words):
        series_create(user=alice, gpus=[gpus[0]], start=at(), end=at(hours=1), rule=rule, zone=zone)


def test_overlapping_occurrences_are_refused(alice, gpus, clock):
    with pytest.raises(InvalidBooking, match="must not overlap"):
        series_create(user=alice, gpus=[gpus[0]], start=at(), end=at(hours=30), rule="FREQ=DAILY;COUNT=3", zone="UTC")


def test_only_the_owner_or_an_admin_changes_a_series(alice, bob, carol, gpus, clock):
    series = series_create(
        user=alice, gpus=[gpus[0]], start=at(hours=1), end=at(hours=2), rule="FREQ=DAILY;COUNT=2", zone="UTC"
    ).series
    with pytest.raises(NotAllowed):
        series_cancel(series=series, actor=bob)
    assert len(series_cancel(series=series, actor=carol)) == 2


def test_an_edit_moving_todays_booking_into_the_past_is_refused_not_dropped(alice, gpus, clock):
    # 09:00 now; the series books 10:00-11:00 today and tomorrow. Moving it to 08:00 cannot move today's.
    series = series_create(
        user=alice, gpus=[gpus[0]], start=at(hours=1), end=at(hours=2), rule="FREQ=DAILY;COUNT=2", zone="UTC"
    ).series
    with pytest.raises(SeriesRefused, match="in the past"):
        series_edit(series=series, actor=alice, start_time=time(8))
    assert walls(series.occurrences.filter(status=Status.APPROVED).order_by("start"), UTC) == [
        ("01-07 10:00", "11:00"),
        ("01-08 10:00", "11:00"),
    ]
    edited = series_edit(series=series, actor=alice, start_time=time(8), mode="skip")
    assert [(o.day.isoformat(), o.outcome) for o in edited.occurrences] == [
        ("2030-01-07", REFUSED),
        ("2030-01-08", BOOKED),
    ]


def test_a_series_the_spring_change_would_make_overlap_is_refused_naming_the_days(alice, gpus, clock, far):
    # Daily at 03:00 for 23:30: the end 02:30 on the night clocks jump to 03:00 becomes 03:30, after 03:00.
    with pytest.raises(InvalidBooking, match="between 2030-03-30 and 2030-03-31") as refused:
        series_create(
            user=alice,
            gpus=[gpus[0]],
            start=local(BERLIN, 2030, 3, 29, 3),
            end=local(BERLIN, 2030, 3, 30, 2, 30),
            rule="FREQ=DAILY;COUNT=4",
            zone="Europe/Berlin",
        )
    assert "03:30 CEST" in refused.value.message and "03:00 CEST" in refused.value.message
    assert not Series.objects.exists()


def test_a_stored_rule_that_dst_now_makes_overlap_still_expands_and_books_the_rest(alice, gpus, clock, far):
    # Stored before the check on real times existed: daily 03:00 for 23:30 in Berlin across the spring change.
    series = series_create(
        user=alice,
        gpus=[gpus[0]],
        start=local(BERLIN, 2030, 3, 29, 3),
        end=local(BERLIN, 2030, 3, 29, 4),
        rule="FREQ=DAILY;COUNT=4",
        zone="Europe/Berlin",
    ).series
    Series.objects.filter(pk=series.pk).update(duration=timedelta(hours=23, minutes=30))
    Reservation.objects.filter(series=series).delete()
    series.refresh_from_db()

    series_book_due()  # beat's daily run goes on, for this series and every other one

    assert len(series_occurrences(series)) == 4  # its page shows it
    # Booked on its own, the overlap is refused naming the occurrence it overlaps (refused by the exclusion
    # constraint inside the series' transaction: the earlier occurrence is there to be named). The constraint
    # is PostgreSQL's.
    if connection.vendor == "postgresql":
        with pytest.raises(SlotConflict) as refused:
            series_book_within_reach(series=series, actor=alice)
        assert "by alice (reservation #" in refused.value.message
