"""Fair-share factors from known histories, against factors worked out by hand (docs/booking-rules.md)."""

from __future__ import annotations

import math
from datetime import timedelta

import pytest
from django.contrib.auth.models import Group

from accounting.models import UsageHour
from fairshare.factors import fairshare_for, fairshare_table
from fairshare.models import GroupShare
from tests.conftest import at
from tests.factories import UserFactory, book, carve_mig

pytestmark = pytest.mark.usefixtures("clock")
NOW = at(0)


def used_for(user, gpus, start, hours):
    """Bookings long past, written as the service leaves them (``direct``: the service refuses the past)."""
    return book(user, gpus, start, start + timedelta(hours=hours), direct=True)


def factors(*users):
    found = fairshare_for([user.pk for user in users], now=NOW)
    return [found[user.pk] for user in users]


def in_group(name, *users, shares=None):
    group = Group.objects.create(name=name)
    group.user_set.add(*users)
    if shares is not None:
        GroupShare.objects.create(group=group, shares=shares)
    return group


def test_nobody_used_anything_everyone_is_at_one(alice, bob, carol):
    assert [item.factor for item in factors(alice, bob, carol)] == [1.0, 1.0, 1.0]


def test_usage_against_equal_shares_without_decay(alice, bob, carol, gpus, settings):
    settings.FAIRSHARE_HALF_LIFE_DAYS = 10_000  # no decay to speak of: the plain formula
    in_group("vision", alice)
    in_group("nlp", bob, carol)
    used_for(alice, [gpus[0]], NOW - timedelta(hours=10), 10)  # 10 GPU-hours
    used_for(bob, gpus[1:4], NOW - timedelta(hours=10), 10)  # 30 GPU-hours
    a, b, c = factors(alice, bob, carol)
    # Shares: two groups of one share each; nlp's half split between bob and carol.
    assert (a.share, b.share, c.share) == (0.5, 0.25, 0.25)
    assert (round(a.usage, 4), round(b.usage, 4), c.usage) == (0.25, 0.75, 0.0)
    assert a.factor == pytest.approx(2 ** (-0.25 / 0.5), abs=1e-4)  # 0.7071
    assert b.factor == pytest.approx(2 ** (-0.75 / 0.25), abs=1e-4)  # 0.125
    assert c.factor == 1.0
    assert round(a.booked_hours, 2) == 10.0


def test_an_hour_a_half_life_ago_counts_half(alice, bob, gpus):
    week = timedelta(days=7)  # FAIRSHARE_HALF_LIFE_DAYS
    used_for(alice, [gpus[0]], NOW - week - timedelta(minutes=30), 1)  # centred a week ago
    used_for(bob, [gpus[1]], NOW - timedelta(hours=1), 1)  # the last hour
    a, b = factors(alice, bob)
    assert a.booked_hours == pytest.approx(0.5, abs=1e-3)
    # The last hour, decayed over its own length: the integral of 2^(-t/7 days) over one hour.
    assert b.booked_hours == pytest.approx(7 * 24 / math.log(2) * (1 - 2 ** (-1 / (7 * 24))), abs=1e-9)
    assert a.usage == pytest.approx(a.booked_hours / (a.booked_hours + b.booked_hours))


def test_used_hours_count_with_their_weight(alice, bob, gpus, settings):
    settings.FAIRSHARE_HALF_LIFE_DAYS = 10_000
    settings.FAIRSHARE_USED_WEIGHT = 2.0
    booking = used_for(alice, [gpus[0]], NOW - timedelta(hours=4), 2)
    used_for(bob, [gpus[1]], NOW - timedelta(hours=4), 4)
    UsageHour.objects.create(
        gpu=gpus[0],
        hour=NOW - timedelta(hours=4),
        reservation=booking,
        user=alice,
        minutes_reported=60,
        minutes_measured=60,
        used_minutes=60,
        utilization_sum=0,
        utilization_samples=0,
    )
    a, _b = factors(alice, bob)
    assert (round(a.booked_hours, 3), round(a.used_hours, 3)) == (2.0, 1.0)
    assert round(a.effective_hours, 3) == 4.0  # 2 booked + 2 x 1 used
    assert round(a.usage, 3) == 0.5  # 4 of 8
    assert "4.0 GPU-hours (2.0 booked + 2 × 1.0 used)" in a.explanation()


def test_a_group_with_more_shares_and_people_in_no_group(alice, bob, carol, settings):
    dave = UserFactory(username="dave")
    in_group("vision", alice, shares=3)
    in_group("nlp", bob, carol)  # the default: 1 share
    a, b, c, d = factors(alice, bob, carol, dave)
    # 3 + 1 shares, plus 1 for the people in no group (dave): 5 in all.
    assert (a.share, b.share, c.share, d.share) == pytest.approx((0.6, 0.1, 0.1, 0.2))
    assert [part.name for part in d.groups] == ["(no group)"]
    assert sum(row.share for row in fairshare_table(now=NOW)) == pytest.approx(1.0)


def test_someone_in_two_groups_has_a_part_of_each(alice, bob, carol):
    in_group("vision", alice, bob)
    in_group("nlp", alice, carol)
    a, b, c = factors(alice, bob, carol)
    assert (a.share, b.share, c.share) == pytest.approx((0.5, 0.25, 0.25))


def test_a_mig_slice_counts_as_its_share_of_a_card(alice, bob, gpus, settings):
    settings.FAIRSHARE_HALF_LIFE_DAYS = 10_000
    slices = carve_mig(gpus[0])
    used_for(alice, [slices[0]], NOW - timedelta(hours=7), 7)  # a 3g of 7: 3 GPU-hours
    used_for(bob, [gpus[1]], NOW - timedelta(hours=3), 3)
    a, _b = factors(alice, bob)
    assert round(a.booked_hours, 3) == 3.0 and round(a.usage, 3) == 0.5


def test_only_approved_time_up_to_now_counts(alice, bob, gpus, settings):
    settings.FAIRSHARE_HALF_LIFE_DAYS = 10_000
    used_for(alice, [gpus[0]], NOW - timedelta(hours=1), 3)  # one hour so far
    book(alice, [gpus[1]], NOW + timedelta(hours=2), NOW + timedelta(hours=4))  # not yet
    book(bob, [gpus[2]], NOW - timedelta(hours=5), NOW - timedelta(hours=3), direct=True, pending=True)
    a, b = factors(alice, bob)
    assert round(a.booked_hours, 3) == 1.0 and b.booked_hours == 0.0


def test_someone_no_longer_active_has_no_share_but_their_usage_still_counts(alice, bob, carol, gpus, settings):
    settings.FAIRSHARE_HALF_LIFE_DAYS = 10_000
    used_for(alice, [gpus[0]], NOW - timedelta(hours=3), 3)
    used_for(bob, [gpus[1]], NOW - timedelta(hours=1), 1)
    bob.is_active = False
    bob.save()
    dave = UserFactory(username="dave", is_active=False)  # never booked anything
    a, b, c, d = factors(alice, bob, carol, dave)
    assert (b.share, b.factor, round(b.usage, 3)) == (0.0, 0.0, 0.25)  # bob's hour is still a quarter of all
    assert (d.share, d.factor) == (0.0, 1.0)  # no usage at all: 1
    assert (a.share, c.share) == (0.5, 0.5)  # the active ones split the shares
    assert a.factor == pytest.approx(2 ** (-0.75 / 0.5))
    assert [row.username for row in fairshare_table(now=NOW)] == ["alice", "carol"]


def test_the_queue_order_is_the_factor_then_arrival(alice, bob, carol, gpus):
    used_for(alice, [gpus[0]], NOW - timedelta(hours=2), 2)
    a, b, c = factors(alice, bob, carol)
    early, late = NOW - timedelta(hours=1), NOW
    queue = sorted([(a, early), (b, late), (c, early)], key=lambda item: item[0].order_key(item[1]))
    # bob and carol used nothing (factor 1): carol came first; alice, who used GPUs, comes last however early.
    assert [item[0].username for item in queue] == ["carol", "bob", "alice"]


def test_asking_for_many_people_costs_a_few_queries(alice, bob, carol, gpus, django_assert_max_num_queries):
    people = [UserFactory() for _ in range(20)]
    in_group("vision", *people[:10], shares=2)
    for person, gpu in zip(people[:4], gpus, strict=True):
        used_for(person, [gpu], NOW - timedelta(hours=2), 2)
    with django_assert_max_num_queries(5):
        found = fairshare_for([person.pk for person in people], now=NOW)
    assert len(found) == 20 and all(0 < item.factor <= 1 for item in found.values())


def test_settings_that_would_divide_by_zero_stop_the_portal(settings):
    from fairshare.checks import check_fairshare_settings

    assert check_fairshare_settings() == []
    settings.FAIRSHARE_HALF_LIFE_DAYS = 0
    settings.FAIRSHARE_USED_WEIGHT = -1
    settings.FAIRSHARE_HORIZON_CAP_BELOW = 2
    messages = [message.msg for message in check_fairshare_settings()]
    assert messages == [
        "FAIRSHARE_HALF_LIFE_DAYS=0: the days after which an hour of usage counts half must be a number above 0.",
        "FAIRSHARE_USED_WEIGHT=-1: what a used GPU-hour adds must be 0 or more.",
        "FAIRSHARE_HORIZON_CAP_BELOW=2: the factor under which the cap applies is between 0 and 1.",
    ]
