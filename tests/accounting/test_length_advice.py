"""Advice on a slot's length from the person's own last bookings of as many GPUs (accounting/length_advice.py):
over the API, and printed by the CLI after a booking far longer than that history."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from accounting.models import UsageHour
from tests.api_helpers import client_for
from tests.factories import book

ADVICE = "/api/v1/me/length-advice/"


def past_booking(user, gpus, days_ago: int, hours: int, busy_minutes_per_gpu: int | None):
    """A booking ``days_ago`` days back of ``hours`` hours; each GPU busy that many minutes in its first hours
    (None: its node measured nothing)."""
    start = (datetime.now(UTC) - timedelta(days=days_ago)).replace(minute=0, second=0, microsecond=0)
    booking = book(user, gpus, start, start + timedelta(hours=hours), direct=True)
    for gpu in gpus:
        left = busy_minutes_per_gpu
        for hour in range(hours):
            used = 0 if left is None else min(60, left)
            UsageHour.objects.create(
                gpu=gpu, hour=start + timedelta(hours=hour), reservation=booking, user=user,
                minutes_reported=60, minutes_measured=0 if left is None else 60, used_minutes=used,
                utilization_sum=0, utilization_samples=0,
            )  # fmt: skip
            left = None if left is None else left - used
    return booking


@pytest.fixture
def history(alice, bob, gpus):
    """alice: four two-GPU bookings of 8 h whose GPUs were busy 3 h (the newest 2.5 h, the oldest 3.5 h), one
    unmeasured, one of a single GPU; bob: a two-GPU booking busy 8 h."""
    for days, busy in ((2, 150), (3, 180), (4, 180), (5, 210)):
        past_booking(alice, gpus[:2], days, 8, busy)
    past_booking(alice, gpus[:2], 1, 8, None)  # newest, but nobody measured it
    past_booking(alice, gpus[2:3], 1, 8, 480)
    past_booking(bob, gpus[2:4], 6, 8, 480)


def test_the_mean_busy_time_of_the_last_bookings_of_as_many_gpus_and_words_for_a_far_longer_slot(history, alice):
    answer = client_for(alice).get(ADVICE, {"gpus": 2, "hours": 12})
    assert answer.status_code == 200, answer.json()
    assert answer.json() == {
        "gpus": 2,
        "bookings": 4,  # not the unmeasured one, not the one-GPU one, not bob's
        "mean_busy_hours": 3.0,
        "mean_booked_hours": 8.0,
        "suggested_hours": 3.0,
        "advice": "Your last 4 2-GPU bookings were busy 3.0 h on average (booked 8.0 h); this one asks for 12 h. "
        "About 3 h would leave the rest to others.",
    }
    assert client_for(alice).get(ADVICE, {"gpus": 2, "hours": 5}).json()["advice"] is None  # not far longer
    single = client_for(alice).get(ADVICE, {"gpus": 1, "hours": 40}).json()
    assert (single["bookings"], single["suggested_hours"], single["advice"]) == (1, None, None)  # too little history


@pytest.mark.parametrize(
    ("params", "field"), [({}, "gpus"), ({"gpus": 0}, "gpus"), ({"gpus": 2, "hours": -1}, "hours")]
)
def test_bad_questions_are_refused_in_words(alice, params, field):
    answer = client_for(alice).get(ADVICE, params)
    assert answer.status_code == 400
    assert field in answer.json()["error"]["details"]["fields"]
    assert client_for(None).get(ADVICE, {"gpus": 1}).status_code == 401
