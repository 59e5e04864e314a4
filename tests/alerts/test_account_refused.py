"""A node refusing a lease's account (no such account there, or a system one) opens an alert that
names the person and the node; a later grant to that account on that node resolves it."""

from __future__ import annotations

import pytest

from alerts.models import Alert
from reservations.services import reservation_create
from tests.alerts.helpers import event
from tests.conftest import at
from tests.factories import node_with_gpus

pytestmark = pytest.mark.usefixtures("clock")
MESSAGE = "'www-data' is a system account on this node (uid 33 is below UID_MIN 1000)"


def open_refusals():
    return Alert.objects.filter(kind=Alert.Kind.ACCOUNT_REFUSED, resolved_at__isnull=True)


def test_a_refused_lease_opens_one_alert_naming_the_person_node_and_booking(alice, node, gpus):
    booking = reservation_create(user=alice, gpus=gpus[:1], start=at(0), end=at(1))

    for _ in range(3):  # the agent reports it once per lease, but a restart reports it again
        event(node, "lease_refused", user="alice", reservation=booking.pk, message=MESSAGE)

    (alert,) = open_refusals()
    assert (alert.node, alert.gpu, alert.username, alert.user, alert.reservation) == (
        node,
        None,
        "alice",
        alice,
        booking,
    )
    assert alert.details["event"]["message"] == MESSAGE
    assert str(alert) == "Account refused by a node: gpu-a100 (alice)"


def test_a_node_cannot_link_the_alert_to_another_nodes_booking(alice, node, gpus):
    elsewhere = node_with_gpus(1, name="gpu-h100")
    theirs = reservation_create(user=alice, gpus=list(elsewhere.gpus.all()), start=at(0), end=at(1))

    event(node, "lease_refused", user="alice", reservation=theirs.pk, message=MESSAGE)
    event(node, "lease_refused", user="bob", reservation=10**12, message=MESSAGE)  # no such booking at all

    assert sorted(open_refusals().values_list("username", "reservation")) == [("alice", None), ("bob", None)]


def test_a_later_grant_to_that_account_on_that_node_resolves_it(alice, node, gpus):
    event(node, "lease_refused", user="alice", message=MESSAGE)
    event(node_with_gpus(1, name="gpu-h100"), "lease_refused", user="alice", message=MESSAGE)

    event(node, "granted", gpu=gpus[0], user="alice")

    assert list(open_refusals().values_list("node__name", flat=True)) == ["gpu-h100"]
    resolved = Alert.objects.get(kind=Alert.Kind.ACCOUNT_REFUSED, node=node)
    assert resolved.resolution == "the node gave that account a GPU after all"
