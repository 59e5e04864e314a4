"""Extending where booking needs approval: the added time is a pending extension that holds the
slot and opens nothing until an admin approves it; the approved part stays approved and enforced."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.urls import reverse

from audit.models import AuditEntry
from reservations import selectors
from reservations.exceptions import InvalidState, LimitExceeded, SlotConflict
from reservations.leases import node_leases
from reservations.models import Allocation, Limit, Reservation
from reservations.services import (
    reservation_approve,
    reservation_cancel,
    reservation_create,
    reservation_extend,
    reservation_reject,
    reservation_release,
)
from tests.api_helpers import client_for
from tests.conftest import MONDAY_9, at
from tests.factories import book

pytestmark = pytest.mark.usefixtures("clock")
Status = Reservation.Status
URL = "/api/v1/reservations/"
ENDED = {"cancel": "cancelled", "release": "released"}


@pytest.fixture
def approval_node(node):
    node.requires_approval = True
    node.save()
    return node


@pytest.fixture
def running(alice, carol, gpus, approval_node):
    """alice's booking of GPU 0 from now for an hour, approved by carol."""
    booking = book(alice, gpus[:1], at(0), at(1))
    return reservation_approve(reservation=booking, actor=carol)


@pytest.fixture
def long_slots(db):
    """The site lets a slot run three weeks (the default ceiling is a week)."""
    return Limit.objects.create(scope=Limit.Scope.SITE, max_slot_hours=24 * 21)


def leased_until(node, reservation) -> str | None:
    lease = next((item for item in node_leases(node=node, now=MONDAY_9) if item["reservation"] == reservation.pk), None)
    return lease and lease["end"]


def test_a_twenty_day_extension_waits_for_approval_and_the_approved_hour_stays_enforced(
    running, alice, approval_node, long_slots
):
    booking = reservation_extend(reservation=running, actor=alice, end=at(1, days=20))

    booking.refresh_from_db()
    assert (booking.status, booking.end) == (Status.APPROVED, at(1))  # the approved part is unchanged
    extension = selectors.pending_extension(booking)
    assert (extension.status, extension.start, extension.end, extension.extends) == (
        Status.PENDING,
        at(1),
        at(1, days=20),
        booking,
    )
    assert list(extension.allocations.values_list("gpu_id", "active")) == list(
        booking.allocations.values_list("gpu_id", "active")
    )
    assert leased_until(approval_node, booking) == at(1).isoformat()  # the node still closes it after an hour
    assert leased_until(approval_node, extension) is None
    assert AuditEntry.objects.filter(action="reservation.request_extension", target_id=str(extension.pk)).exists()


def test_the_pending_extension_holds_the_slot(running, alice, bob, gpus, long_slots):
    reservation_extend(reservation=running, actor=alice, end=at(5))

    with pytest.raises(SlotConflict, match="pending"):
        reservation_create(user=bob, gpus=gpus[:1], start=at(2), end=at(3))


def test_approving_merges_the_extension_into_the_booking(running, alice, carol, approval_node):
    reservation_extend(reservation=running, actor=alice, end=at(6))
    extension = selectors.pending_extension(running)

    merged = reservation_approve(reservation=extension, actor=carol, reason="deadline week")

    assert merged.pk == running.pk
    running.refresh_from_db()
    assert (running.status, running.end, running.decision_reason) == (Status.APPROVED, at(6), "deadline week")
    assert not Reservation.objects.filter(pk=extension.pk).exists()
    assert list(Allocation.objects.filter(reservation=running).values_list("start", "end", "active")) == [
        (at(0), at(6), True)
    ]
    assert leased_until(approval_node, running) == at(6).isoformat()
    actions = list(
        AuditEntry.objects.filter(action__in=["reservation.approve", "reservation.extend"])
        .values_list("action", "target_id")
        .order_by("pk")
    )
    assert actions[-2:] == [("reservation.approve", str(extension.pk)), ("reservation.extend", str(running.pk))]


def test_rejecting_keeps_the_booking_as_it_was_and_frees_the_time(running, alice, bob, carol, gpus):
    reservation_extend(reservation=running, actor=alice, end=at(4))
    extension = selectors.pending_extension(running)

    reservation_reject(reservation=extension, actor=carol, reason="the GPU is promised to bob")

    running.refresh_from_db()
    extension.refresh_from_db()
    assert (running.status, running.end) == (Status.APPROVED, at(1))
    assert extension.status == Status.REJECTED
    reservation_create(user=bob, gpus=gpus[:1], start=at(1), end=at(4))  # the time is free again


def test_the_owner_withdraws_a_request_even_after_its_time_has_come(running, alice, clock):
    reservation_extend(reservation=running, actor=alice, end=at(4))
    extension = selectors.pending_extension(running)
    clock.shift(timedelta(hours=2))  # the booking ended at 10:00; nobody has decided yet

    reservation_cancel(reservation=extension, actor=alice, reason="done early")

    extension.refresh_from_db()
    assert extension.status == Status.CANCELLED
    assert not extension.allocations.filter(active=True).exists()


def test_an_extension_waits_in_a_queue_of_one(running, alice):
    reservation_extend(reservation=running, actor=alice, end=at(3))
    waiting = selectors.pending_extension(running)

    with pytest.raises(
        InvalidState, match=f"already has an extension until .* waiting for approval \\(#{waiting.pk}\\)"
    ):
        reservation_extend(reservation=running, actor=alice, end=at(5))


@pytest.mark.parametrize("actor", ["alice", "carol"])
def test_the_request_itself_is_never_made_longer_while_it_waits(running, actor, request):
    """Issue 37: the admin approves the time they saw. Withdrawing it and asking again is the way."""
    reservation_extend(reservation=running, actor=request.getfixturevalue("alice"), end=at(3))
    waiting = selectors.pending_extension(running)

    with pytest.raises(InvalidState, match=f"Extension request #{waiting.pk} waits for an admin's approval") as refused:
        reservation_extend(reservation=waiting, actor=request.getfixturevalue(actor), end=at(5))

    assert f"Withdraw it and extend reservation #{running.pk} again to the later end" in str(refused.value)
    waiting.refresh_from_db()
    assert (waiting.status, waiting.end) == (Status.PENDING, at(3))
    alice = request.getfixturevalue("alice")
    reservation_cancel(reservation=waiting, actor=alice)
    reservation_extend(reservation=running, actor=alice, end=at(5))
    assert selectors.pending_extension(running).end == at(5)


def test_a_booking_waiting_for_approval_is_never_extended(alice, carol, gpus, approval_node):
    """Issue 37: extending it used to lengthen it in place, still pending, so the admin approved 24 hours for the
    one they had looked at."""
    booking = reservation_create(user=alice, gpus=gpus[:1], start=at(1), end=at(2))
    for actor in (alice, carol):
        with pytest.raises(InvalidState, match="waits for an admin's approval and cannot be extended"):
            reservation_extend(reservation=booking, actor=actor, end=at(1, days=1))

    booking.refresh_from_db()
    assert (booking.status, booking.end) == (Status.PENDING, at(2))
    assert list(booking.allocations.values_list("end", flat=True)) == [at(2)]
    assert not AuditEntry.objects.filter(action="reservation.extend", target_id=str(booking.pk)).exists()


@pytest.mark.parametrize("end_it", ["cancel", "release"])
def test_an_undecided_extension_goes_with_its_booking(alice, carol, gpus, approval_node, clock, end_it):
    booking = reservation_approve(
        reservation=reservation_create(user=alice, gpus=gpus[:1], start=at(1), end=at(2)), actor=carol
    )
    reservation_extend(reservation=booking, actor=alice, end=at(4))
    extension = selectors.pending_extension(booking)
    if end_it == "cancel":
        reservation_cancel(reservation=booking, actor=alice)
    else:
        clock.shift(timedelta(hours=1, minutes=30))
        reservation_release(reservation=booking, actor=alice)

    extension.refresh_from_db()
    assert extension.status == Status.CANCELLED
    assert extension.cancel_reason == f"reservation #{booking.pk} was {ENDED[end_it]}"


def test_an_extension_of_a_booking_released_meanwhile_cannot_be_approved(running, alice, carol):
    reservation_extend(reservation=running, actor=alice, end=at(3))
    extension = selectors.pending_extension(running)
    Reservation.objects.filter(pk=running.pk).update(end=at(0.5))  # as an old portal release would leave it

    with pytest.raises(InvalidState, match="is no longer running up to its start"):
        reservation_approve(reservation=extension, actor=carol)


def test_releasing_a_pending_extension_says_to_withdraw_it(running, alice, clock):
    reservation_extend(reservation=running, actor=alice, end=at(3))
    extension = selectors.pending_extension(running)
    clock.shift(timedelta(hours=1, minutes=30))

    with pytest.raises(InvalidState, match="withdraw it"):
        reservation_release(reservation=extension, actor=alice)


def test_an_admin_extends_at_once(running, carol, long_slots):
    extended = reservation_extend(reservation=running, actor=carol, end=at(1, days=20))

    assert extended.end == at(1, days=20)
    assert selectors.pending_extension(extended) is None


def test_where_no_approval_is_needed_the_booking_is_extended_at_once(alice, gpus):
    booking = reservation_create(user=alice, gpus=gpus[:1], start=at(0), end=at(1))

    extended = reservation_extend(reservation=booking, actor=alice, end=at(3))

    assert (extended.status, extended.end) == (Status.APPROVED, at(3))
    assert not Reservation.objects.filter(extends=booking).exists()


def test_limits_that_require_approval_make_extensions_wait_too(alice, gpus):
    Limit.objects.create(scope=Limit.Scope.USER, user=alice, requires_approval=True)
    booking = reservation_create(user=alice, gpus=gpus[:1], start=at(0), end=at(1), actor=None)
    Reservation.objects.filter(pk=booking.pk).update(status=Status.APPROVED)

    reservation_extend(reservation=booking, actor=alice, end=at(2))

    booking.refresh_from_db()
    assert booking.end == at(1)
    assert selectors.pending_extension(booking).end == at(2)


# --- the same through the API and the pages ---------------------------------------------------------


def test_the_api_shows_the_request_and_an_admin_approves_it(running, alice, carol):
    response = client_for(alice).post(f"{URL}{running.pk}/extend/", {"end": at(1, days=2).isoformat()}, format="json")

    assert response.status_code == 200
    body = response.json()
    assert body["end"] == "2030-01-07T10:00:00Z"
    waiting = body["pending_extension"]
    assert waiting["end"] == "2030-01-09T10:00:00Z"
    listed = client_for(carol).get(f"{URL}?status=pending").json()["results"]
    assert [(item["id"], item["extends"]) for item in listed] == [(waiting["id"], running.pk)]

    approved = client_for(carol).post(f"{URL}{waiting['id']}/approve/", {"reason": "ok"}, format="json")

    assert approved.status_code == 200
    assert (approved.json()["id"], approved.json()["end"], approved.json()["pending_extension"]) == (
        running.pk,
        "2030-01-09T10:00:00Z",
        None,
    )


def test_a_researcher_cannot_approve_their_own_extension(running, alice):
    reservation_extend(reservation=running, actor=alice, end=at(3))
    waiting = selectors.pending_extension(running)

    response = client_for(alice).post(f"{URL}{waiting.pk}/approve/", {}, format="json")

    assert response.status_code == 403
    waiting.refresh_from_db()
    assert waiting.status == Status.PENDING


def test_the_pages_say_the_extension_waits_and_the_admin_decides_there(running, alice, carol):
    researcher = Client()
    researcher.force_login(alice)
    response = researcher.post(reverse("reservation-action", args=[running.pk, "extend"]), {"hours": "4"}, follow=True)
    (message,) = [str(m) for m in response.context["messages"]]
    assert message.startswith(f"Extension of reservation #{running.pk} until ")
    assert "waits for an admin's approval" in message
    waiting = selectors.pending_extension(running)
    mine = researcher.get(reverse("my-reservations")).content.decode()
    assert f"Extension until Mon 7 Jan 2030, 14:00 waits for approval (#{waiting.pk})" in mine
    assert "Withdraw extension request" in mine

    admin = Client()
    admin.force_login(carol)
    pending_page = admin.get(reverse("pending-approvals")).content.decode()
    assert f"<strong>Extension</strong> of #{running.pk}" in pending_page
    response = admin.post(reverse("reservation-action", args=[waiting.pk, "approve"]), {"reason": ""}, follow=True)

    assert [str(m) for m in response.context["messages"]] == [
        f"Extension #{waiting.pk} of alice approved: reservation #{running.pk} now ends Mon 7 Jan 2030, 14:00 (UTC)."
    ]


def test_an_extension_is_judged_with_its_booking(running, alice, settings):
    """The longest slot counts from the booking's start, as the merged booking would run."""
    settings.MAX_SLOT_HOURS = 10

    with pytest.raises(LimitExceeded, match="longest slot: 16 hours asked > 10 allowed"):
        reservation_extend(reservation=running, actor=alice, end=at(16))
    assert selectors.pending_extension(running) is None


def test_the_approvals_page_approves_the_slot_it_showed(alice, carol, gpus, approval_node):
    """The page shows the pending booking's slot; extending it meanwhile is refused (on the booking's page the
    control is gone and says why), so Approve approves exactly what the admin read."""
    booking = reservation_create(user=alice, gpus=gpus[:1], start=at(1), end=at(2))
    admin = Client()
    admin.force_login(carol)
    shown = admin.get(reverse("pending-approvals")).content.decode()
    assert f'id="reservation-{booking.pk}"' in shown
    assert "Mon 7 Jan 2030, 10:00 – 11:00" in " ".join(shown.split())

    researcher = Client()
    researcher.force_login(alice)
    detail = researcher.get(reverse("reservation-detail", args=[booking.pk])).content.decode()
    assert reverse("reservation-action", args=[booking.pk, "extend"]) not in detail
    assert "A booking waiting for approval cannot be extended" in detail
    mine = researcher.get(reverse("my-reservations")).content.decode()
    assert reverse("reservation-action", args=[booking.pk, "extend"]) not in mine
    refused = researcher.post(
        reverse("reservation-action", args=[booking.pk, "extend"]), {"hours": "4"}, follow=True
    )  # a form kept open in another tab
    assert [str(m) for m in refused.context["messages"]] == [
        f"Reservation #{booking.pk} waits for an admin's approval and cannot be extended: the admin approves the "
        "slot they saw. Wait for the decision and extend it then, or cancel it and book the longer slot."
    ]

    approved = admin.post(reverse("reservation-action", args=[booking.pk, "approve"]), {"reason": ""}, follow=True)

    assert approved.status_code == 200
    booking.refresh_from_db()
    assert (booking.status, booking.start, booking.end) == (Status.APPROVED, at(1), at(2))


def test_acting_on_an_extension_merged_meanwhile_answers_in_words(running, alice, carol):
    reservation_extend(reservation=running, actor=alice, end=at(3))
    waiting = selectors.pending_extension(running)
    stale = Reservation.objects.get(pk=waiting.pk)  # what a second admin's page or request holds
    reservation_approve(reservation=waiting, actor=carol)

    with pytest.raises(InvalidState, match="no longer exists: an extension is merged into its booking"):
        reservation_approve(reservation=stale, actor=carol)
    with pytest.raises(InvalidState, match="no longer exists"):
        reservation_cancel(reservation=stale, actor=alice)
    with pytest.raises(InvalidState, match="no longer exists"):
        reservation_extend(reservation=stale, actor=alice, end=at(5))


@pytest.mark.django_db(transaction=True)
def test_extending_an_extension_merged_meanwhile_answers_in_words_outside_a_transaction(running, alice, carol):
    """As a web request calls it (autocommit, no transaction around it): words, not a row-lock error."""
    reservation_extend(reservation=running, actor=alice, end=at(3))
    waiting = selectors.pending_extension(running)
    stale = Reservation.objects.get(pk=waiting.pk)
    reservation_approve(reservation=waiting, actor=carol)

    with pytest.raises(InvalidState, match="no longer exists: an extension is merged into its booking"):
        reservation_extend(reservation=stale, actor=alice, end=at(5))
