"""The waitlist pages: yours (join, claim, decline, leave) and the admins' queue per node."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client

from reservations.services import reservation_cancel
from tests.conftest import at
from tests.factories import UserFactory, book
from waitlist.models import Entry
from waitlist.services import Want, entry_join

pytestmark = pytest.mark.usefixtures("clock")


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def local(hours: float) -> str:
    """What a datetime-local field sends, in the user's zone (UTC for the test users)."""
    return at(hours).strftime("%Y-%m-%dT%H:%M")


def test_joining_from_the_page_puts_you_in_the_queue(alice, bob, gpus):
    book(bob, [gpus[0]], at(1), at(3))
    form = {
        "gpus": [gpus[0].pk],
        "earliest_start": local(1),
        "latest_end": local(3),
        "duration": 120,
        "auto_book": "on",
    }
    response = logged_in(alice).post("/waitlist/", form, follow=True)
    html = response.content.decode()
    assert "You are on the waitlist for gpu-a100/GPU 0 for 2 h." in html
    assert "1 (next)" in html
    assert Entry.objects.get().user == alice


def test_a_form_that_cannot_be_met_says_why_and_writes_nothing(alice, gpus):
    form = {"gpus": [gpus[0].pk], "earliest_start": local(1), "latest_end": local(2), "duration": 120}
    response = logged_in(alice).post("/waitlist/", form)
    assert response.status_code == 200
    assert "shorter than the duration asked for" in response.content.decode()
    response = logged_in(alice).post("/waitlist/", {"earliest_start": local(1), "latest_end": local(3), "duration": 60})
    assert response.status_code == 400 and "Choose the GPUs, or a node and how many." in response.content.decode()
    assert not Entry.objects.exists()


def test_the_calendars_refusal_link_prefills_the_form(alice, gpus):
    query = {"gpus": f"{gpus[1].pk},{gpus[2].pk}", "start": at(1).isoformat(), "end": at(3).isoformat()}
    html = logged_in(alice).get("/waitlist/", query).content.decode()
    assert f'value="{gpus[1].pk}" selected' in html and f'value="{gpus[2].pk}" selected' in html
    assert f'value="{local(1)}"' in html and f'value="{local(3)}"' in html
    assert '<option value="120" selected>' in html


def test_an_offer_is_claimed_or_declined_from_the_page(alice, bob, gpus, django_capture_on_commit_callbacks):
    dave = UserFactory(username="dave")
    taken = book(bob, [gpus[0]], at(1), at(3))
    window = {"earliest_start": at(1), "latest_end": at(3), "duration": timedelta(hours=2), "auto_book": False}
    mine = entry_join(user=alice, want=Want(gpus=[gpus[0]], **window))
    theirs = entry_join(user=dave, want=Want(gpus=[gpus[0]], **window), now=at(0) + timedelta(seconds=1))
    with django_capture_on_commit_callbacks(execute=True):
        reservation_cancel(reservation=taken, actor=bob)

    html = logged_in(alice).get("/waitlist/").content.decode()
    assert "Slots on offer to you" in html and "Held for you until <strong>09:15</strong>" in html
    # Someone else's entry is not found, whatever the action.
    assert logged_in(dave).post(f"/waitlist/{mine.pk}/claim/").status_code == 404
    with django_capture_on_commit_callbacks(execute=True):
        response = logged_in(alice).post(f"/waitlist/{mine.pk}/decline/", follow=True)
    assert "Declined: the slot passes to the next person waiting." in response.content.decode()
    theirs.refresh_from_db()
    assert theirs.status == Entry.Status.OFFERED
    with django_capture_on_commit_callbacks(execute=True):
        response = logged_in(dave).post(f"/waitlist/{theirs.pk}/claim/", follow=True)
    assert "The slot is yours" in response.content.decode()
    assert logged_in(dave).get(f"/waitlist/{theirs.pk}/claim/").status_code == 405  # POST only


def test_the_queue_is_for_admins(alice, bob, carol, gpus):
    book(bob, [gpus[0]], at(1), at(3))
    window = {"earliest_start": at(1), "latest_end": at(3), "duration": timedelta(hours=2)}
    entry_join(user=alice, want=Want(gpus=[gpus[0]], **window))
    assert logged_in(alice).get("/waitlist/queue/").status_code == 403
    html = logged_in(carol).get("/waitlist/queue/").content.decode()
    assert "gpu-a100" in html and "alice" in html and "gpu-a100/GPU 0 for 2 h" in html
