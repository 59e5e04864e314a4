"""Sending nodes their lease snapshots over Celery: after commit, coalesced, expiring.

A change to a node's bookings schedules one push of its *whole* state once the transaction
commits. Bursts coalesce: the first change sets a short-lived "push pending" mark in Redis
and queues the push a moment later; the changes that follow while the mark is set ride on
that same push, because the task clears the mark *before* it reads the database. Beat
re-pushes every node each minute, so a push lost to a Redis outage is repaired soon after.
"""

from __future__ import annotations

import json
import logging

import redis
from django.conf import settings
from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from kernel.redis_client import redis_client
from nodes.agent.worker import APPLY_SNAPSHOT_TASK, queue_name
from nodes.leases import node_snapshot
from nodes.models import Node

log = logging.getLogger(__name__)

PENDING_KEY = "gpubook:lease-push-pending:{node_id}"


def push_after_commit(node_id: int) -> None:
    """Push ``node_id``'s leases once the current transaction commits (now, outside one)."""
    transaction.on_commit(lambda: request_push(node_id))


def request_push(node_id: int) -> None:
    """Queue a coalesced push. A broker outage is logged, not raised: the booking has committed,
    and beat's next full push delivers the state."""
    from nodes.tasks import push_node_leases

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
    from portal.celery import app

    snapshot = node_snapshot(node=node, now=timezone.now())
    queue = queue_name(node.name)
    app.send_task(
        APPLY_SNAPSHOT_TASK,
        # One JSON string, not the object: the agent parses it itself, within its own size and nesting
        # limits (kombu would parse an object before the agent could look at it). Older agents take only
        # the object: upgrade the agents first (docs/agent.md, "Upgrading").
        args=[json.dumps(snapshot, separators=(",", ":"))],
        # Straight to the key node.<name> (the anonymous exchange: routing key = queue), with no priority:
        # the agent reads that one key and nothing else (nodes/agent/worker.py, AGENT_TRANSPORT_OPTIONS).
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
