"""Sending nodes their lease snapshots over Celery: after commit, coalesced, expiring.

A change to a node's bookings schedules one push of its *whole* state once the transaction
commits (reservations/receivers.py, on ``reservation_changed``). Bursts coalesce: the first change
sets a short-lived "push pending" mark in Redis and queues the push a moment later; the changes that
follow while the mark is set ride on that same push, because the task clears the mark *before* it
reads the database. Beat re-pushes every node each minute, so a push lost to a Redis outage is
repaired soon after.

Two brokers are involved. The push *tasks* are the portal's own: queued on, and run from, the portal's Celery
broker (CELERY_BROKER_URL). The snapshot they send goes to the nodes' broker (NODE_BROKER_URL, nodes/node_broker.py),
which one node's credential could fill up: there a publish fails within seconds and is logged, the node's
lease version has moved on all the same, and its agent pulls the snapshot over HTTPS once its heartbeat
reply shows it behind (docs/agent.md, "The pull").
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
from nodes.node_broker import NodeBrokerError, publish
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
    """Build ``node``'s signed snapshot now and put it on its queue of the nodes' broker; the version sent.

    Raises NodeBrokerError when that broker took nothing. The version is issued either way (it is in the
    database before the publish), so the node's next heartbeat reply shows it behind and it pulls."""
    snapshot = node_snapshot(node=node, now=timezone.now())
    publish(
        task=APPLY_SNAPSHOT_TASK,
        # One JSON string, not the object (protocol.snapshot_message). Older agents take only the object:
        # upgrade the agents first (docs/agent.md, "Upgrading").
        args=[snapshot_message(snapshot)],
        queue=queue_name(node.name),
        expires=settings.LEASE_PUSH_EXPIRES_SECONDS,
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
# Given back when its pool process is killed under it (portal/settings.py): one node's state, which beat resends a
# minute later only.
@shared_task(name="nodes.push_node_leases", ignore_result=True, reject_on_worker_lost=True)
def push_node_leases(node_id: int) -> int | None:
    """Send one node its state. The pending mark goes first, so a change committed from now on
    schedules another push instead of being missed."""
    clear_pending(node_id)
    node = agent_nodes().filter(pk=node_id).first()
    if node is None:
        return None
    try:
        return send_snapshot(node)
    except NodeBrokerError as error:  # the pull brings the node this state; beat tries the push again
        log.warning("could not push the leases of node %s (its agent pulls them): %s", node.name, error)
        return None


@shared_task(name="nodes.push_all_leases", ignore_result=True)
def push_all_leases() -> int:
    """Beat, every minute: every node with an agent gets its whole state again.

    The first push the nodes' broker refuses ends the round: the rest would only wait on the same broker, each
    up to its timeouts. It raises, so the job counts as failed and, failing for minutes, opens the admins'
    jobs-late alert; the nodes pull meanwhile."""
    nodes = pushed_nodes()
    for done, node in enumerate(nodes):
        try:
            send_snapshot(node)
        except NodeBrokerError as error:
            log.warning("pushed %d of %d nodes' leases, then: %s; the rest pull theirs", done, len(nodes), error)
            raise
    return len(nodes)
