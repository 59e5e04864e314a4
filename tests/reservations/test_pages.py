"""The server-rendered reservation pages: my reservations, approvals, and the action forms."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.urls import reverse

from reservations.models import Reservation
from reservations.offers import offer_create
from reservations.services import reservation_cancel, reservation_create, reservation_reject
from tests.api_helpers import client_for
from tests.conftest import MONDAY_9, at
from tests.factories import book, node_with_gpus

pytestmark = pytest.mark.usefixtures("clock")
Status = Reservation.Status
MINE = reverse("my-reservations")
PENDING = reverse("pending-approvals")


def logged_in(user, **client_options) -> Client:
    client = Client(**client_options)
    client.force_login(user)
    return client


def act(reservation: Reservation, action: str) -> str:
    return reverse("reservation-action", kwargs={"pk": reservation.pk, "action": action})


def flashed(response) -> list[str]:
    return [str(message) for message in response.context["messages"]]


@pytest.fixture
def approval_node(db):
    return node_with_gpus(2, name="gpu-h100", requires_approval=True)


@pytest.fixture
def pending(alice, approval_node):
    return book(alice, list(approval_node.gpus.all()), at(2), at(4), purpose="sweep")


def snapshot(reservation: Reservation) -> tuple:
    reservation.refresh_from_db()
    return reservation.status, reservation.start, reservation.end


# --- who may see and do what -----------------------------------------------------------------


@pytest.mark.parametrize("url", [MINE, PENDING])
def test_anonymous_visitors_are_sent_to_log_in(client, url):
    response = client.get(url)
    assert response.status_code == 302
    assert response.url == f"{reverse('login')}?next={url}"


def test_an_anonymous_action_is_sent_to_log_in_and_changes_nothing(client, alice, gpus):
    booking = reservation_create(user=alice, gpus=gpus[:1], start=at(1), end=at(2))
    response = client.post(act(booking, "cancel"))
    assert response.status_code == 302
    assert response.url.startswith(reverse("login"))
    assert snapshot(booking)[0] == Status.APPROVED


def test_researchers_get_a_friendly_403_on_the_approvals_page(alice, pending):
    response = logged_in(alice).get(PENDING)
    assert response.status_code == 403
    assert "Admins only" in response.content.decode()
    assert reverse("my-reservations") in response.content.decode()


def test_admins_see_every_pending_request(carol, alice, pending, gpus):
    reservation_create(user=alice, gpus=gpus[:1], start=at(1), end=at(2))  # approved: not listed
    response = logged_in(carol).get(PENDING)
    assert response.status_code == 200
    assert response.context["nav"] == "pending"
    assert [row.reservation.pk for row in response.context["rows"]] == [pending.pk]
    html = response.content.decode()
    assert "sweep" in html and "gpu-h100" in html and "alice" in html
    assert act(pending, "approve") in html and act(pending, "reject") in html
    assert "/admin/reservations/reservation/?status__exact=pending" in html


def test_a_researcher_cannot_approve_even_their_own_request(alice, pending):
    response = logged_in(alice).post(act(pending, "approve"))
    assert response.status_code == 403
    assert snapshot(pending)[0] == Status.PENDING


def test_a_researcher_cannot_reject(alice, bob, pending):
    response = logged_in(bob).post(act(pending, "reject"), {"reason": "mine now"})
    assert response.status_code == 403
    assert snapshot(pending)[0] == Status.PENDING


@pytest.mark.parametrize(
    ("action", "data"),
    [("cancel", {}), ("release", {}), ("extend", {"hours": "1"}), ("extend", {"end": "2030-01-07T20:00"})],
)
def test_acting_on_someone_elses_reservation_is_a_404(alice, bob, gpus, clock, action, data):
    upcoming = reservation_create(user=bob, gpus=gpus[:1], start=at(1), end=at(3))
    running = reservation_create(user=bob, gpus=gpus[1:2], start=at(0), end=at(2))
    for booking in (upcoming, running):
        before = snapshot(booking)
        response = logged_in(alice).post(act(booking, action), data)
        assert response.status_code == 404
        assert snapshot(booking) == before


def test_an_admin_may_act_on_anyones_reservation(carol, bob, gpus):
    booking = reservation_create(user=bob, gpus=gpus[:1], start=at(1), end=at(3))
    response = logged_in(carol).post(act(booking, "cancel"), follow=True)
    assert flashed(response) == [f"Reservation #{booking.pk} cancelled; its GPUs are free for others again."]
    assert snapshot(booking)[0] == Status.CANCELLED


@pytest.mark.parametrize("action", ["cancel", "release", "extend", "approve", "reject"])
def test_actions_take_post_only(carol, pending, action):
    assert logged_in(carol).get(act(pending, action)).status_code == 405


def test_an_unknown_action_is_a_404(carol, pending):
    assert logged_in(carol).post(act(pending, "delete")).status_code == 404
    assert snapshot(pending)[0] == Status.PENDING


def test_actions_need_the_csrf_token(alice, gpus):
    booking = reservation_create(user=alice, gpus=gpus[:1], start=at(1), end=at(2))
    client = logged_in(alice, enforce_csrf_checks=True)
    assert client.post(act(booking, "cancel")).status_code == 403
    assert snapshot(booking)[0] == Status.APPROVED


def test_the_forms_on_the_page_carry_the_csrf_token(alice, gpus):
    reservation_create(user=alice, gpus=gpus[:1], start=at(1), end=at(2))
    client = logged_in(alice, enforce_csrf_checks=True)
    html = client.get(MINE).content.decode()
    assert html.count('name="csrfmiddlewaretoken"') >= 4  # cancel, two extend forms, log out


# --- the actions -------------------------------------------------------------------------------


def test_cancel_an_upcoming_reservation(alice, gpus):
    booking = reservation_create(user=alice, gpus=gpus[:1], start=at(1), end=at(2))
    response = logged_in(alice).post(act(booking, "cancel"), follow=True)
    assert response.redirect_chain == [(MINE, 302)]
    assert flashed(response) == [f"Reservation #{booking.pk} cancelled; its GPUs are free for others again."]
    assert snapshot(booking)[0] == Status.CANCELLED


def test_release_a_running_reservation(alice, gpus, clock):
    booking = reservation_create(user=alice, gpus=gpus[:1], start=at(0), end=at(2))
    clock.shift(timedelta(minutes=30))
    response = logged_in(alice).post(act(booking, "release"), follow=True)
    assert flashed(response) == [f"Reservation #{booking.pk} released; GPU access ends now."]
    assert snapshot(booking) == (Status.APPROVED, at(0), at(0.5))


def test_releasing_a_slot_that_has_not_started_shows_the_services_message(alice, gpus):
    booking = reservation_create(user=alice, gpus=gpus[:1], start=at(1), end=at(2))
    response = logged_in(alice).post(act(booking, "release"), follow=True)
    assert response.status_code == 200
    assert flashed(response) == [f"Reservation #{booking.pk} starts at 2030-01-07 10:00 UTC: cancel it instead."]
    assert snapshot(booking) == (Status.APPROVED, at(1), at(2))


def test_extend_by_hours(alice, gpus):
    booking = reservation_create(user=alice, gpus=gpus[:1], start=at(0), end=at(2))
    response = logged_in(alice).post(act(booking, "extend"), {"hours": "2"}, follow=True)
    assert flashed(response) == [f"Reservation #{booking.pk} extended: it now ends Mon 7 Jan 2030, 13:00 (UTC)."]
    assert snapshot(booking)[2] == at(4)


def test_a_custom_end_is_read_in_the_users_time_zone(alice, gpus):
    alice.timezone = "Europe/Berlin"
    alice.save()
    booking = reservation_create(user=alice, gpus=gpus[:1], start=at(1), end=at(2))
    response = logged_in(alice).post(act(booking, "extend"), {"end": "2030-01-07T15:00"}, follow=True)
    assert flashed(response) == [
        f"Reservation #{booking.pk} extended: it now ends Mon 7 Jan 2030, 15:00 (Europe/Berlin)."
    ]
    assert snapshot(booking)[2] == at(5)  # 15:00 in Berlin is 14:00 UTC


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({}, "Choose how many hours to add, or enter a new end."),
        ({"end": "soon"}, "New end: Enter the new end as a date and time, like 2030-01-07 14:00."),
        ({"hours": "3"}, "Extend by: Choose +1, +2 or +4 hours."),
    ],
)
def test_bad_extend_input_names_the_problem(alice, gpus, data, message):
    booking = reservation_create(user=alice, gpus=gpus[:1], start=at(1), end=at(2))
    response = logged_in(alice).post(act(booking, "extend"), data, follow=True)
    assert flashed(response) == [message]
    assert snapshot(booking)[2] == at(2)


def test_an_end_that_does_not_exist_in_the_users_zone_is_refused(alice, gpus):
    alice.timezone = "Europe/Berlin"
    alice.save()
    booking = reservation_create(user=alice, gpus=gpus[:1], start=at(1), end=at(2))
    # Clocks in Berlin jump from 02:00 to 03:00 on 2030-03-31.
    response = logged_in(alice).post(act(booking, "extend"), {"end": "2030-03-31T02:30"}, follow=True)
    [message] = flashed(response)
    assert message.startswith("New end: 2030-03-31 02:30:00 couldn’t be interpreted in time zone Europe/Berlin")
    assert snapshot(booking)[2] == at(2)


def test_extending_into_someone_elses_slot_is_refused_with_the_conflict(alice, bob, gpus):
    booking = reservation_create(user=alice, gpus=gpus[:1], start=at(1), end=at(2))
    taken = reservation_create(user=bob, gpus=gpus[:1], start=at(2), end=at(4))
    response = logged_in(alice).post(act(booking, "extend"), {"hours": "1"}, follow=True)
    assert response.status_code == 200
    assert flashed(response) == [
        f"Slot taken: gpu-a100/GPU 0 is booked 2030-01-07 11:00–13:00 UTC by bob (reservation #{taken.pk})."
    ]
    assert snapshot(booking)[2] == at(2)


def test_an_admin_approves_with_a_note(carol, pending):
    response = logged_in(carol).post(act(pending, "approve"), {"reason": "enjoy", "next": PENDING}, follow=True)
    assert response.redirect_chain == [(PENDING, 302)]
    assert flashed(response) == [f"Reservation #{pending.pk} of alice approved; the GPUs are theirs from the start."]
    pending.refresh_from_db()
    assert (pending.status, pending.decision_reason, pending.decided_by) == (Status.APPROVED, "enjoy", carol)


def test_an_admin_rejects_with_a_reason(carol, pending):
    response = logged_in(carol).post(act(pending, "reject"), {"reason": "node reserved for the course"}, follow=True)
    assert flashed(response) == [f"Reservation #{pending.pk} of alice rejected; its slot is free again."]
    pending.refresh_from_db()
    assert (pending.status, pending.decision_reason) == (Status.REJECTED, "node reserved for the course")


@pytest.mark.parametrize("reason", ["", "   "])
def test_a_rejection_needs_a_reason(carol, pending, reason):
    response = logged_in(carol).post(act(pending, "reject"), {"reason": reason}, follow=True)
    assert flashed(response) == ["Reason: Give a reason for the rejection: the researcher will read it."]
    assert snapshot(pending)[0] == Status.PENDING


def test_approving_twice_shows_the_services_message(carol, pending):
    client = logged_in(carol)
    client.post(act(pending, "approve"), follow=True)  # reads the first message
    response = client.post(act(pending, "approve"), follow=True)
    assert flashed(response) == [f"Reservation #{pending.pk} is approved and cannot be approved."]


@pytest.mark.parametrize(
    "target", ["https://evil.example/", "//evil.example/", "https:///evil.example", "javascript:alert(1)"]
)
def test_next_cannot_leave_the_site(alice, gpus, target):
    booking = reservation_create(user=alice, gpus=gpus[:1], start=at(1), end=at(2))
    response = logged_in(alice).post(act(booking, "cancel"), {"next": target})
    assert response.status_code == 302
    assert response.url == MINE


def test_next_may_name_a_local_page(alice, gpus):
    booking = reservation_create(user=alice, gpus=gpus[:1], start=at(1), end=at(2))
    response = logged_in(alice).post(act(booking, "cancel"), {"next": "/?week=2030-01-07"})
    assert response.url == "/?week=2030-01-07"


# --- my reservations -------------------------------------------------------------------------


def test_my_reservations_are_grouped_running_upcoming_past(alice, bob, carol, gpus, approval_node, clock):
    clock.move_to(MONDAY_9 - timedelta(days=40))
    ancient = reservation_create(user=alice, gpus=gpus[:1], start=at(1, days=-40), end=at(2, days=-40))
    clock.move_to(MONDAY_9 - timedelta(days=2))
    finished = reservation_create(user=alice, gpus=gpus[:1], start=at(1, days=-2), end=at(2, days=-2))
    clock.move_to(MONDAY_9)
    running = reservation_create(user=alice, gpus=gpus[:1], start=at(0), end=at(2))
    upcoming = reservation_create(user=alice, gpus=gpus[1:2], start=at(3), end=at(5))
    tentative = reservation_create(user=alice, gpus=[approval_node.gpus.first()], start=at(1), end=at(2))
    cancelled = reservation_create(user=alice, gpus=gpus[2:3], start=at(6), end=at(7))
    reservation_cancel(reservation=cancelled, actor=alice, reason="plans changed")
    refused = reservation_create(user=alice, gpus=[approval_node.gpus.first()], start=at(10), end=at(11))
    reservation_reject(reservation=refused, actor=carol, reason="course on that day")
    reservation_create(user=bob, gpus=gpus[3:4], start=at(0), end=at(1))  # not alice's

    response = logged_in(alice).get(MINE)
    assert response.status_code == 200
    assert response.context["nav"] == "mine"
    groups = {group["id"]: [row.reservation.pk for row in group["rows"]] for group in response.context["groups"]}
    assert groups == {
        "running": [running.pk],
        "upcoming": [tentative.pk, upcoming.pk],
        "past": [refused.pk, cancelled.pk, finished.pk],
    }
    assert ancient.pk not in groups["past"]
    html = response.content.decode()
    assert "tentative: pending approval" in html
    assert "Cancelled Mon 7 Jan, 09:00: plans changed" in html
    assert "Rejected by carol: course on that day" in html
    assert "Ran to its end." in html
    assert act(running, "release") in html and act(running, "cancel") not in html
    assert act(upcoming, "cancel") in html and act(upcoming, "release") not in html
    assert act(cancelled, "cancel") not in html and act(cancelled, "extend") not in html
    assert act(finished, "extend") not in html


def test_a_slot_offered_from_the_waitlist_is_ahead_with_a_link_to_claim_it_not_among_the_finished(alice, gpus, clock):
    clock.move_to(MONDAY_9)
    offer = offer_create(user=alice, gpus=gpus[:1], start=at(3), end=at(5), now=MONDAY_9)
    clock.move_to(MONDAY_9 - timedelta(days=1))
    lapsed = offer_create(
        user=alice, gpus=gpus[1:2], start=at(1, days=-1), end=at(2, days=-1), now=MONDAY_9 - timedelta(days=1)
    )
    clock.move_to(MONDAY_9)

    response = logged_in(alice).get(MINE)
    groups = {group["id"]: [row.reservation.pk for row in group["rows"]] for group in response.context["groups"]}
    assert groups == {"running": [], "upcoming": [offer.pk], "past": [lapsed.pk]}
    html = response.content.decode()
    assert "offered from the waitlist</span>" in html
    assert f'<a href="{reverse("waitlist")}">claim or decline it on your waitlist</a>' in html
    assert "Offered from the waitlist, not taken before its end." in html
    assert "Ran to its end." not in html
    assert act(offer, "cancel") not in html and act(offer, "extend") not in html  # claimed on the waitlist page
    assert "ssh alice@" not in html  # not hers until taken


def test_the_node_instructions_name_host_uuids_and_indices(alice, gpus):
    running = reservation_create(user=alice, gpus=[gpus[3], gpus[1]], start=at(0), end=at(2))
    html = logged_in(alice).get(MINE).content.decode()
    assert "ssh alice@gpu-a100.lab.example" in html
    assert f"export CUDA_VISIBLE_DEVICES={gpus[1].uuid},{gpus[3].uuid}" in html
    assert "CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=1,3" in html
    assert running.node.hostname == "gpu-a100.lab.example"


def test_a_pending_request_gets_no_node_instructions(alice, pending):
    html = logged_in(alice).get(MINE).content.decode()
    assert "CUDA_VISIBLE_DEVICES" not in html
    assert "ssh alice@" not in html
    assert "an admin has to approve it" in html


def test_without_a_unix_username_the_page_says_where_to_set_it(alice, gpus):
    reservation_create(user=alice, gpus=gpus[:1], start=at(0), end=at(2))
    alice.unix_username = None
    alice.save()
    html = logged_in(alice).get(MINE).content.decode()
    assert "You have no unix username yet." in html
    assert f'href="{reverse("profile")}"' in html
    assert "ssh " not in html


def test_times_are_shown_in_the_users_time_zone(alice, gpus):
    alice.timezone = "Europe/Berlin"
    alice.save()
    reservation_create(user=alice, gpus=gpus[:1], start=at(0), end=at(2))
    html = logged_in(alice).get(MINE).content.decode()
    assert "Times are in Europe/Berlin" in html
    assert "Mon 7 Jan 2030, 10:00 –\n          12:00" in html
    assert 'value="2030-01-07T12:00"' in html  # the extend form's end, in the same zone


def test_a_refusal_names_times_in_the_readers_zone(alice, bob, gpus, clock):
    alice.timezone = "Europe/Berlin"
    alice.save()
    theirs = reservation_create(user=bob, gpus=gpus[:1], start=at(2), end=at(3))
    mine = reservation_create(user=alice, gpus=gpus[:1], start=at(1), end=at(2))

    page = logged_in(alice).post(act(mine, "extend"), {"hours": "1"}, follow=True)
    (message,) = flashed(page)
    assert f"booked 2030-01-07 12:00–13:00 CET by bob (reservation #{theirs.pk})" in message

    # A script with a token reads UTC (its zone is not the browser's).
    response = client_for(alice).post(
        f"/api/v1/reservations/{mine.pk}/extend/", {"end": at(3).isoformat()}, format="json"
    )
    assert "booked 2030-01-07 11:00–12:00 UTC by bob" in response.json()["error"]["message"]
    assert snapshot(mine)[2] == at(2)
