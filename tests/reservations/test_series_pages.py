"""The series page, /series/<id>/: its occurrences and their state, the series' actions (book what came
within reach, cancel from an occurrence on or all, change the time), only for the owner and admins; My
reservations links occurrences to it."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client

from reservations.models import Limit, Reservation
from reservations.series import series_create
from tests.conftest import at

pytestmark = pytest.mark.usefixtures("clock")


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def weekly(alice, gpus):
    Limit.objects.create(scope=Limit.Scope.USER, user=alice, max_days_ahead=10)
    return series_create(
        user=alice, gpus=[gpus[0]], start=at(hours=1), end=at(hours=3), rule="FREQ=WEEKLY;COUNT=4", zone="UTC"
    ).series


def test_the_owner_sees_the_occurrences_and_others_get_404(alice, bob, carol, weekly):
    page = logged_in(alice).get(f"/series/{weekly.pk}/").content.decode()
    assert "10:00–12:00 (UTC wall time), repeating <code>FREQ=WEEKLY;COUNT=4</code>, all or nothing" in page
    assert page.count("Approved") == 2 and page.count("Not booked yet") == 2
    assert "Book the occurrences now within reach" in page
    assert logged_in(bob).get(f"/series/{weekly.pk}/").status_code == 404
    assert logged_in(bob).post(f"/series/{weekly.pk}/cancel/", {"scope": "all"}).status_code == 404
    assert "of alice" in logged_in(carol).get(f"/series/{weekly.pk}/").content.decode()
    mine = logged_in(alice).get("/reservations/mine/").content.decode()
    assert f'href="/series/{weekly.pk}/"' in mine and f"series #{weekly.pk}" in mine


def test_book_within_reach_then_cancel_following_from_the_page(alice, weekly, clock):
    client = logged_in(alice)
    clock.shift(timedelta(days=7))
    response = client.post(f"/series/{weekly.pk}/book/", follow=True)
    assert "1 of 2 occurrences were booked, 1 not bookable yet" in response.content.decode()
    response = client.post(f"/series/{weekly.pk}/cancel/", {"scope": "following", "from": "2030-01-21"}, follow=True)
    assert "1 booking cancelled" in response.content.decode()  # 28 January was not booked yet
    assert weekly.occurrences.filter(status=Reservation.Status.APPROVED).count() == 2
    assert "Cancelled" in response.content.decode()
    refused = client.post(f"/series/{weekly.pk}/cancel/", {"scope": "following"}, follow=True).content.decode()
    assert "Say from which occurrence" in refused


def test_change_the_time_from_an_occurrence_on(alice, weekly):
    response = logged_in(alice).post(
        f"/series/{weekly.pk}/edit/", {"from": "2030-01-14", "start_time": "14:00", "minutes": "90"}, follow=True
    )
    assert f"Series #{weekly.pk} changed: 1 of 3 occurrences were booked" in response.content.decode()
    live = weekly.occurrences.filter(status=Reservation.Status.APPROVED).order_by("start")
    assert [(r.start, r.end) for r in live] == [
        (at(hours=1), at(hours=3)),
        (at(days=7, hours=5), at(days=7, hours=6.5)),
    ]
    bad = logged_in(alice).post(f"/series/{weekly.pk}/edit/", {"start_time": "25:99"}, follow=True).content.decode()
    assert "is not a time of day like 10:00" in bad


def test_admins_see_series_and_their_occurrences_read_only_in_admin(carol, weekly):
    client = logged_in(carol)
    listing = client.get("/admin/reservations/series/").content.decode()
    assert "FREQ=WEEKLY;COUNT=4" in listing
    change = client.get(f"/admin/reservations/series/{weekly.pk}/change/")
    assert change.status_code == 200
    first = weekly.occurrences.order_by("start").first()
    assert f'/admin/reservations/reservation/{first.pk}/change/">#{first.pk}</a>' in change.content.decode()
    assert 'name="_save"' not in change.content.decode()
