from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.contrib.auth.models import Group
from django.core import checks

from reservations.exceptions import LimitExceeded
from reservations.limits import Period, busiest_week, effective_limits, peak_gpus
from reservations.models import Limit, Reservation
from reservations.services import reservation_create, reservation_extend
from tests.conftest import at
from tests.factories import book

pytestmark = pytest.mark.usefixtures("clock")


def site_limits(**values):
    return Limit.objects.create(scope=Limit.Scope.SITE, **values)


def test_weekly_gpu_hours_refusal_names_the_numbers(alice, gpus):
    site_limits(weekly_gpu_hours=40)
    book(alice, gpus[:2], at(1), at(20))  # 38 GPU-hours

    with pytest.raises(LimitExceeded) as refused:
        book(alice, gpus[2:4], at(24), at(26))  # 4 more

    assert refused.value.message == "weekly GPU-hours: 38 used + 4 asked > 40 allowed"
    assert refused.value.details == {"limit": "weekly_gpu_hours", "used": 38.0, "asked": 4.0, "allowed": 40.0}
    assert Reservation.objects.count() == 1


def test_weekly_hours_are_a_rolling_seven_days(alice, gpus):
    site_limits(weekly_gpu_hours=40)
    book(alice, gpus[:2], at(1), at(20))
    # 7 days after the first booking ended, it no longer counts.
    assert book(alice, gpus[:2], at(20 + 7 * 24), at(20 + 7 * 24 + 2)).allocations.count() == 2


def test_weekly_hours_count_later_bookings_too(alice, gpus):
    site_limits(weekly_gpu_hours=10)
    book(alice, gpus[:1], at(48), at(56))  # 8 h on Wednesday
    with pytest.raises(LimitExceeded, match="weekly GPU-hours: 8 used \\+ 4 asked > 10 allowed"):
        book(alice, gpus[:1], at(1), at(5))


def test_gpus_at_once_counts_what_is_held_at_the_same_moment(alice, gpus):
    site_limits(max_gpus_at_once=3)
    book(alice, gpus[:2], at(1), at(3))
    book(alice, gpus[2:4], at(3), at(5))  # back to back: never more than 2 at once

    with pytest.raises(LimitExceeded) as refused:
        book(alice, gpus[2:4], at(2), at(3))
    assert refused.value.message == "GPUs at once: 2 held + 2 asked > 3 allowed"


def test_longest_slot(alice, gpus):
    site_limits(max_slot_hours=8)
    with pytest.raises(LimitExceeded, match=r"^longest slot: 8.5 hours asked > 8 allowed$"):
        book(alice, gpus[:1], at(1), at(9.5))
    assert book(alice, gpus[:1], at(1), at(9)).end == at(9)


def test_days_ahead(alice, gpus):
    site_limits(max_days_ahead=14)
    with pytest.raises(LimitExceeded, match=r"^days ahead: the slot ends 15 days from now > 14 allowed$"):
        book(alice, gpus[:1], at(14 * 24 + 23), at(15 * 24))


def test_admins_may_book_past_limits(carol, alice, gpus):
    site_limits(max_gpus_at_once=1, max_slot_hours=1)
    reservation = book(alice, gpus, at(1), at(30), actor=carol)
    assert reservation.allocations.count() == 4
    assert book(carol, gpus, at(30), at(60)).status == Reservation.Status.APPROVED


def test_a_user_override_beats_the_groups_and_the_most_generous_group_wins(alice):
    site_limits(max_gpus_at_once=1, weekly_gpu_hours=10, max_days_ahead=7)
    students, staff = Group.objects.create(name="students"), Group.objects.create(name="postdocs")
    alice.groups.add(students, staff)
    Limit.objects.create(scope=Limit.Scope.GROUP, group=students, max_gpus_at_once=2, requires_approval=True)
    Limit.objects.create(scope=Limit.Scope.GROUP, group=staff, max_gpus_at_once=4, requires_approval=False)
    Limit.objects.create(scope=Limit.Scope.USER, user=alice, weekly_gpu_hours=100)

    limits = effective_limits(alice)

    assert limits.max_gpus_at_once == 4  # the more generous group
    assert limits.weekly_gpu_hours == 100  # her own override
    assert limits.max_days_ahead == 7  # the site default
    assert limits.max_slot_hours == 168  # set nowhere: the site ceiling MAX_SLOT_HOURS
    assert limits.ceilings == {"max_slot_hours"}
    assert limits.requires_approval is False  # one group books without approval


def test_other_groups_limits_do_not_apply(alice, bob):
    group = Group.objects.create(name="guests")
    bob.groups.add(group)
    Limit.objects.create(scope=Limit.Scope.GROUP, group=group, max_gpus_at_once=1)
    assert effective_limits(alice).max_gpus_at_once is None


def test_a_limit_that_requires_approval_makes_bookings_pending(alice, carol, gpus):
    site_limits(requires_approval=True)
    assert book(alice, gpus[:1], at(1), at(2)).status == Reservation.Status.PENDING
    assert book(alice, gpus[1:2], at(1), at(2), actor=carol).status == Reservation.Status.APPROVED


def test_extending_checks_the_limits_on_the_added_time(alice, gpus):
    site_limits(weekly_gpu_hours=10, max_slot_hours=8)
    reservation = book(alice, gpus[:1], at(1), at(5))

    with pytest.raises(LimitExceeded, match=r"^longest slot: 9 hours asked > 8 allowed$"):
        reservation_extend(reservation=reservation, actor=alice, end=at(10))
    reservation_extend(reservation=reservation, actor=alice, end=at(9))
    book(alice, gpus[1:2], at(20), at(21))
    with pytest.raises(LimitExceeded, match="weekly GPU-hours: 9 used \\+ 2 asked > 10 allowed"):
        book(alice, gpus[1:2], at(30), at(32))


def test_peak_gpus_ignores_periods_outside_the_window():
    held = [Period(at(0), at(2), 2), Period(at(1), at(3), 1), Period(at(5), at(6), 4)]
    assert peak_gpus(held, at(0), at(4)) == 3
    assert peak_gpus(held, at(2), at(4)) == 1


def test_busiest_week_finds_the_worst_window_not_just_the_one_ending_at_the_booking():
    # 10 h two days before, 10 h six days after: no single week holds both with the 1 h asked
    # in the middle... except windows do: [day -2, day +5) has 10 + 1, [day 0, day 7) has 1 + 10.
    held = [Period(at(-48), at(-38), 1), Period(at(144), at(154), 1)]
    used, asked = busiest_week(held, Period(at(0), at(1), 1))
    assert (used / 3600, asked / 3600) == (10, 1)
    # With both inside one week of the booking they add up.
    held = [Period(at(-48), at(-38), 1), Period(at(24), at(34), 1)]
    used, asked = busiest_week(held, Period(at(0), at(1), 1))
    assert (used / 3600, asked / 3600) == (20, 1)


# --- the site ceilings: MAX_DAYS_AHEAD and MAX_SLOT_HOURS where no Limit sets the field --------


def test_with_no_limit_rows_a_booking_far_ahead_is_refused_naming_the_ceiling(alice, gpus):
    # Before the ceilings a researcher could book a GPU until the year 9999 on a fresh portal.
    assert not Limit.objects.exists()
    with pytest.raises(LimitExceeded) as refused:
        reservation_create(user=alice, gpus=gpus[:1], start=at(1), end=datetime(2999, 12, 31, tzinfo=UTC))
    assert refused.value.message == (
        "days ahead: the slot ends 354277.7 days from now > 90 allowed "
        "(the site ceiling MAX_DAYS_AHEAD: an admin can set another in a Limit)"
    )
    assert refused.value.details == {
        "limit": "max_days_ahead",
        "asked": 354277.7,
        "allowed": 90,
        "ceiling": "MAX_DAYS_AHEAD",
    }
    assert not Reservation.objects.exists()


def test_the_days_ahead_ceiling_is_exact_at_its_edge(alice, gpus):
    assert book(alice, gpus[:1], at(90 * 24 - 1), at(90 * 24)).end == at(days=90)
    with pytest.raises(LimitExceeded, match=r"^days ahead: the slot ends 90.1 days from now > 90 allowed \(the site"):
        book(alice, gpus[1:2], at(90 * 24), at(90 * 24 + 1))


def test_with_no_limit_rows_a_slot_longer_than_a_week_is_refused_naming_the_ceiling(alice, gpus):
    with pytest.raises(LimitExceeded) as refused:
        book(alice, gpus[:1], at(1), at(1 + 168.25))
    assert refused.value.message == (
        "longest slot: 168.25 hours asked > 168 allowed "
        "(the site ceiling MAX_SLOT_HOURS: an admin can set another in a Limit)"
    )
    assert refused.value.details["ceiling"] == "MAX_SLOT_HOURS"
    assert book(alice, gpus[:1], at(1), at(1 + 168)).end == at(169)


def test_extending_past_the_ceiling_is_refused_and_changes_nothing(alice, gpus):
    reservation = book(alice, gpus[:1], at(1), at(100))
    with pytest.raises(LimitExceeded, match=r"^longest slot: 170 hours asked > 168 allowed \(the site ceiling"):
        reservation_extend(reservation=reservation, actor=alice, end=at(171))
    reservation.refresh_from_db()
    assert reservation.end == at(100)


def test_the_ceilings_are_read_from_the_settings(alice, gpus, settings):
    settings.MAX_DAYS_AHEAD, settings.MAX_SLOT_HOURS = 2, 3
    with pytest.raises(LimitExceeded, match=r"^longest slot: 4 hours asked > 3 allowed"):
        book(alice, gpus[:1], at(1), at(5))
    with pytest.raises(LimitExceeded, match=r"^days ahead: the slot ends 3 days from now > 2 allowed"):
        book(alice, gpus[:1], at(71), at(72))


def test_a_site_limit_raises_the_ceiling_and_the_refusal_then_names_no_setting(alice, gpus):
    site_limits(max_days_ahead=400, max_slot_hours=500)
    assert book(alice, gpus[:1], at(300 * 24), at(300 * 24 + 400)).end == at(300 * 24 + 400)
    with pytest.raises(LimitExceeded) as refused:
        book(alice, gpus[1:2], at(1), at(502))
    assert refused.value.message == "longest slot: 501 hours asked > 500 allowed"
    assert "ceiling" not in refused.value.details


def test_a_site_limit_without_these_fields_leaves_the_ceilings(alice, gpus):
    site_limits(weekly_gpu_hours=1000)
    limits = effective_limits(alice)
    assert (limits.max_days_ahead, limits.max_slot_hours) == (90, 168)
    assert limits.ceilings == {"max_days_ahead", "max_slot_hours"}
    with pytest.raises(LimitExceeded, match=r"\(the site ceiling MAX_DAYS_AHEAD"):
        book(alice, gpus[:1], at(100 * 24), at(100 * 24 + 1))


def test_a_group_limit_raises_the_ceiling_for_its_members_only(alice, bob, gpus):
    long_runs = Group.objects.create(name="long-runs")
    alice.groups.add(long_runs)
    Limit.objects.create(scope=Limit.Scope.GROUP, group=long_runs, max_slot_hours=720)
    assert book(alice, gpus[:1], at(1), at(700)).end == at(700)
    with pytest.raises(LimitExceeded, match=r"^longest slot: 699 hours asked > 168 allowed \(the site ceiling"):
        book(bob, gpus[1:2], at(1), at(700))


def test_a_user_limit_may_lower_the_ceiling(alice, gpus):
    Limit.objects.create(scope=Limit.Scope.USER, user=alice, max_days_ahead=7)
    with pytest.raises(LimitExceeded, match=r"^days ahead: the slot ends 8 days from now > 7 allowed$"):
        book(alice, gpus[:1], at(8 * 24 - 1), at(8 * 24))


def test_a_limit_allowing_more_days_than_a_datetime_counts_does_not_overflow(alice, gpus):
    site_limits(max_days_ahead=2_000_000_000)  # an admin's "no limit"; timedelta stops at 999,999,999 days
    assert book(alice, gpus[:1], at(200 * 24), at(200 * 24 + 1)).end == at(200 * 24 + 1)


def test_admins_book_past_the_ceilings(carol, alice, gpus):
    assert book(alice, gpus[:1], at(1), at(400), actor=carol).end == at(400)
    assert book(carol, gpus[1:2], at(1000 * 24), at(1000 * 24 + 1)).end == at(1000 * 24 + 1)


def test_the_api_names_the_ceiling_in_a_403(alice, gpus):
    from tests.api_helpers import client_for

    response = client_for(alice).post(
        "/api/v1/reservations/",
        {"gpus": [gpus[0].pk], "start": at(1).isoformat(), "end": "2999-12-31T00:00:00Z"},
        format="json",
    )
    assert response.status_code == 403
    error = response.json()["error"]
    assert error["code"] == "limit_exceeded"
    assert error["message"] == (
        "days ahead: the slot ends 354277.7 days from now > 90 allowed "
        "(the site ceiling MAX_DAYS_AHEAD: an admin can set another in a Limit)"
    )
    assert error["details"]["ceiling"] == "MAX_DAYS_AHEAD"


# --- the system checks ------------------------------------------------------------------------


def database_checks() -> list:
    return checks.run_checks(tags=[checks.Tags.database], databases=["default"])


def test_a_warning_says_when_no_site_wide_limit_exists(db):
    [warning] = [message for message in database_checks() if message.id == "reservations.W001"]
    assert warning.level == checks.WARNING
    assert "MAX_DAYS_AHEAD=90 days ahead, MAX_SLOT_HOURS=168 hours a slot" in warning.msg
    site_limits()  # even with every field empty: someone chose
    assert not [message for message in database_checks() if message.id == "reservations.W001"]


def test_the_warning_needs_the_database_checks(db):
    # A plain `manage.py check` does not read the database (Django's rule for database checks).
    assert not [message for message in checks.run_checks() if message.id == "reservations.W001"]


@pytest.mark.parametrize("value", [0, -5])
def test_a_ceiling_below_one_is_an_error(settings, value):
    settings.MAX_SLOT_HOURS = value
    [error] = [message for message in checks.run_checks() if message.id == "reservations.E001"]
    assert error.level == checks.ERROR
    assert f"MAX_SLOT_HOURS={value}" in error.msg
