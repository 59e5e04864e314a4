"""A node refusing a lease's account (no such account there, or a system one) opens an alert that
names the person and the node; a later grant, a new unix username or a deactivation resolves it."""

from __future__ import annotations

import pytest

from accounts.services import unix_username_confirm, unix_username_request, user_deactivate
from alerts.models import Alert
from nodes.models import NodeEvent
from reservations.services import reservation_create
from tests.alerts.helpers import event
from tests.conftest import at
from tests.factories import book, carve_mig, node_with_gpus

pytestmark = pytest.mark.usefixtures("clock")
MESSAGE = "'alice' is a system account on this node (uid 33 is below UID_MIN 1000)"


def open_refusals():
    return Alert.objects.filter(kind=Alert.Kind.ACCOUNT_REFUSED, resolved_at__isnull=True)


@pytest.fixture
def refused(alice, node, gpus):
    """alice's booking on the node, whose lease the node refused."""
    booking = book(alice, gpus[:1], at(0), at(1))
    event(node, "lease_refused", user="alice", reservation=booking.pk, message=MESSAGE)
    return booking


def test_a_refused_lease_opens_one_alert_naming_the_person_node_and_booking(refused, alice, node):
    for _ in range(2):  # the agent reports it once per lease, but a restart reports it again
        event(node, "lease_refused", user="alice", reservation=refused.pk, message=MESSAGE)

    (alert,) = open_refusals()
    assert (alert.node, alert.gpu, alert.username, alert.user, alert.reservation) == (
        node,
        None,
        "alice",
        alice,
        refused,
    )
    assert alert.details["event"]["message"] == MESSAGE
    assert str(alert) == "Account refused by a node: gpu-a100 (alice)"


def test_a_node_opens_nothing_for_leases_it_was_never_sent(alice, bob, node, gpus):
    """A hostile node cannot fill the alerts with names nobody booked with, nor claim others' bookings."""
    elsewhere = node_with_gpus(1, name="gpu-h100")
    theirs = reservation_create(user=alice, gpus=list(elsewhere.gpus.all()), start=at(0), end=at(1))
    bobs = reservation_create(user=bob, gpus=gpus[:1], start=at(0), end=at(1))

    event(node, "lease_refused", user="alice", reservation=theirs.pk, message=MESSAGE)  # another node's booking
    event(node, "lease_refused", user="alice", reservation=bobs.pk, message=MESSAGE)  # not alice's booking
    event(node, "lease_refused", user="mallory", reservation=10**12, message=MESSAGE)  # no such booking

    assert not open_refusals().exists()
    assert NodeEvent.objects.filter(node=node, kind="lease_refused").count() == 3  # still on record


def test_a_later_grant_to_that_account_on_that_node_resolves_it(refused, alice, gpus, node):
    other = node_with_gpus(1, name="gpu-h100")
    theirs = reservation_create(user=alice, gpus=list(other.gpus.all()), start=at(0), end=at(1))
    event(other, "lease_refused", user="alice", reservation=theirs.pk, message=MESSAGE)

    event(node, "granted", gpu=gpus[0], user="alice")

    assert list(open_refusals().values_list("node__name", flat=True)) == ["gpu-h100"]
    assert Alert.objects.get(node=node, kind=Alert.Kind.ACCOUNT_REFUSED).resolution == (
        "the node gave that account a GPU after all"
    )


def test_a_new_unix_username_resolves_it(refused, alice, carol, django_capture_on_commit_callbacks):
    unix_username_request(user=alice, name="alice_lab", actor=alice)
    with django_capture_on_commit_callbacks(execute=True):
        unix_username_confirm(user=alice, name="alice_lab", actor=carol)

    assert not open_refusals().exists()
    assert Alert.objects.get(kind=Alert.Kind.ACCOUNT_REFUSED).resolution == "the person's unix username was changed"


def test_a_deactivation_resolves_it(refused, alice, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        user_deactivate(user=alice, actor=None)

    assert not open_refusals().exists()


def test_a_slice_refused_because_its_card_left_mig_mode_is_not_an_account_problem(alice, node, gpus):
    pieces = carve_mig(gpus[0])
    booking = book(alice, pieces[:1], at(0), at(1))
    event(node, "lease_refused", gpu=pieces[0], user="alice", reservation=booking.pk, message="MIG is off")
    assert not open_refusals().exists()
    assert NodeEvent.objects.get(node=node, kind="lease_refused").gpu == pieces[0]
