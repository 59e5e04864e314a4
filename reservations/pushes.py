"""Sending nodes their lease snapshots over Celery: after commit, coalesced, expiring.

A change to a node's bookings schedules one push of its *whole* state once the transaction
commits (reservations/receivers.py, on ``reservation_changed``). Bursts coalesce: the first change
sets a short-lived "push pending" mark in Redis and queues the push a moment later; the changes that
follow while the mark is set ride on that same push, because the task clears the mark *before* it
reads the database. Beat re-pushes every node each minute, so a push lost to a Redis outage is
repaired soon after.
"""

from __future__ import annotations

import logging

import redis
from celery import shared_task
from django.conf import settings
from django.db.models import QuerySet
from django.utils import timezone

from gpubook_agent.protocol import APPLY_SNAPSHOT_TASK, queue_name, snapshot_message
from kernel.redis_client import redis_client
from nodes.models import Node
from reservations.leases import node_snapshot

log = logging.getLogger(__name__)

PENDING_KEY = "gpubook:lease-push-pending:{node_id}"


def request_push(node_id: int) -> None:
    """Queue a coalesced push. A broker outage is logged, not raised: the booking has committed,
    and beat's next full push delivers the state."""
    delay = settings.LEASE_PUSH_COALESCE_SECONDS
    try:
        key = PENDING_KEY.format(node_id=node_id)
        # The mark outlives the queued task by a margin, so a lost task cannot block pushes for long.
        if redis_client().set(key, "1", nx=True, ex=max(int(delay * 10), 10)):
            push_node_leases.apply_async((node_id,), countdown=delay, expires=settings.LEASE_PUSH_EXPIRES_SECONDS)
    except Exception:
        log.warning("could not queue the lease push for node %s; beat will send it", node_id, exc_info=True)


def clear_pending(node_id: int) -> None:
    try:
        redis_client().delete(PENDING_KEY.format(node_id=node_id))
    except redis.RedisError:
        log.warning("could not clear the push mark of node %s", node_id, exc_info=True)


def send_snapshot(node: Node) -> int:
    """Build ``node``'s signed snapshot now and put it on its queue; the version sent."""
    snapshot = node_snapshot(node=node, now=timezone.now())
    queue = queue_name(node.name)
    push_node_leases.app.send_task(
        APPLY_SNAPSHOT_TASK,
        # One JSON string, not the object (protocol.snapshot_message). Older agents take only the object:
        # upgrade the agents first (docs/agent.md, "Upgrading").
        args=[snapshot_message(snapshot)],
        # Straight to the key node.<name> (the anonymous exchange: routing key = queue), with no priority:
        # the agent reads that one key and nothing else (gpubook_agent/worker.py, AGENT_TRANSPORT_OPTIONS).
        queue=queue,
        routing_key=queue,
        expires=settings.LEASE_PUSH_EXPIRES_SECONDS,
        serializer="json",
    )
    return snapshot["version"]


def agent_nodes() -> QuerySet[Node]:
    """The nodes that have an agent (one was registered: it has a token)."""
    return Node.objects.exclude(agent_token_hash="")


def pushed_nodes() -> list[Node]:
    """Every node that has an agent. Disabled ones too: they take no new bookings but keep their
    existing ones, and a cancellation there must reach the node like anywhere else."""
    return list(agent_nodes().order_by("name"))


# --- the tasks ---------------------------------------------------------------------------------
# They keep the names they had when they lived in nodes/: the names travel in queued
# messages and beat's schedule, and a worker drops a message whose task it does not know.
@shared_task(name="nodes.push_node_leases", ignore_result=True)
def push_node_leases(node_id: int) -> int | None:
    """Send one node its state. The pending mark goes first, so a change committed from now on
    schedules another push instead of being missed."""
    clear_pending(node_id)
    node = agent_nodes().filter(pk=node_id).first()
    if node is None:
        return None
    return send_snapshot(node)


@shared_task(name="nodes.push_all_leases", ignore_result=True)
def push_all_leases() -> int:
    """Beat, every minute: every node with an agent gets its whole state again."""
    nodes = pushed_nodes()
    for node in nodes:
        send_snapshot(node)
    return len(nodes)
