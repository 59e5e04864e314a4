"""Pushing lease snapshots: after commit, coalesced, signed, expiring, through the real Redis broker."""

from __future__ import annotations

import json

import pytest
from django.db import transaction
from django.test import override_settings

from gpubook_agent.protocol import APPLY_SNAPSHOT_TASK
from gpubook_agent.signing import verify
from kernel.redis_client import redis_client
from nodes.models import Node
from nodes.services import node_rotate_credentials
from reservations import pushes
from reservations.models import Reservation
from reservations.pushes import push_all_leases, push_node_leases
from reservations.services import reservation_cancel, reservation_create
from tests.conftest import at
from tests.factories import node_with_gpus
from tests.nodes.queues import messages, purge

pytestmark = pytest.mark.usefixtures("clock")

PUSH_TASK = "nodes.push_node_leases"  # the booking mails go to the same queue
PORTAL_QUEUE = "celery"


@pytest.fixture
def agent_node(node):
    node_rotate_credentials(node=node)
    purge(PORTAL_QUEUE, "node.gpu-a100", pushes.PENDING_KEY.format(node_id=node.pk))
    yield node
    purge(PORTAL_QUEUE, "node.gpu-a100", pushes.PENDING_KEY.format(node_id=node.pk))


def test_a_burst_of_changes_makes_one_push_of_the_whole_state_after_commit(
    agent_node, gpus, alice, bob, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        first = reservation_create(user=alice, gpus=gpus[:2], start=at(0.25), end=at(2))
        reservation_create(user=bob, gpus=gpus[2:3], start=at(1), end=at(3))
        reservation_cancel(reservation=first, actor=alice)
        assert messages(PORTAL_QUEUE) == []  # nothing leaves before the commit

    queued = messages(PORTAL_QUEUE, task=PUSH_TASK)
    assert [(m["task"], m["args"]) for m in queued] == [("nodes.push_node_leases", [agent_node.pk])]
    assert queued[0]["eta"] and queued[0]["expires"]

    push_node_leases(agent_node.pk)  # what the portal's worker does with it

    (sent,) = messages("node.gpu-a100")
    (text,) = sent["args"]
    assert isinstance(text, str)  # one JSON string: the agent parses it within its own limits
    snapshot = json.loads(text)
    agent_node.refresh_from_db()
    assert sent["task"] == APPLY_SNAPSHOT_TASK and sent["expires"]
    assert verify(snapshot, agent_node.lease_secret)
    assert snapshot["version"] == agent_node.lease_version
    assert [(lease["user"], len(lease["gpus"])) for lease in snapshot["leases"]] == [("bob", 1)]


def test_after_a_push_the_next_change_schedules_another(agent_node, gpus, alice, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        reservation_create(user=alice, gpus=gpus[:1], start=at(1), end=at(2))
    push_node_leases(agent_node.pk)
    with django_capture_on_commit_callbacks(execute=True):
        reservation_create(user=alice, gpus=gpus[1:2], start=at(1), end=at(2))

    assert len(messages(PORTAL_QUEUE, task=PUSH_TASK)) == 2


def test_a_rolled_back_change_pushes_nothing(agent_node, gpus, alice, django_capture_on_commit_callbacks):
    with (
        django_capture_on_commit_callbacks(execute=True) as callbacks,
        pytest.raises(RuntimeError),
        transaction.atomic(),
    ):
        reservation_create(user=alice, gpus=gpus[:1], start=at(1), end=at(2))
        raise RuntimeError("the view failed after booking")

    assert callbacks == [] and messages(PORTAL_QUEUE) == []
    assert not Reservation.objects.exists()


def test_a_broker_outage_keeps_the_booking_and_leaves_the_push_to_beat(
    agent_node, gpus, alice, django_capture_on_commit_callbacks, caplog
):
    redis_client.cache_clear()
    try:
        with override_settings(REDIS_URL="redis://127.0.0.1:1/0"), django_capture_on_commit_callbacks(execute=True):
            booked = reservation_create(user=alice, gpus=gpus[:1], start=at(1), end=at(2))
    finally:
        redis_client.cache_clear()

    assert Reservation.objects.filter(pk=booked.pk).exists()
    assert "beat will send it" in caplog.text


def test_beat_pushes_every_node_with_an_agent_disabled_ones_included(agent_node, db):
    disabled = node_with_gpus(1, name="gpu-old")
    node_rotate_credentials(node=disabled)
    Node.objects.filter(pk=disabled.pk).update(status=Node.Status.DISABLED)
    node_with_gpus(1, name="gpu-noagent")  # never registered an agent
    purge("node.gpu-old", "node.gpu-noagent")

    assert push_all_leases() == 2  # a disabled node keeps its bookings, and their cancellations must reach it
    assert len(messages("node.gpu-a100")) == 1 and len(messages("node.gpu-old")) == 1
    assert messages("node.gpu-noagent") == []
