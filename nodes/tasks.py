"""Celery tasks of the portal for nodes: pushing lease snapshots to the agents, keeping the status pages current."""

from __future__ import annotations

from celery import shared_task
from django.utils import timezone

from nodes.broker_users import broker_users_sync
from nodes.pushes import agent_nodes, clear_pending, pushed_nodes, send_snapshot
from nodes.reports import node_events_prune
from nodes.status import refresh_status
from nodes.usage import usage_prune


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


@shared_task(name="nodes.refresh_status", ignore_result=True)
def refresh_live_status() -> int:
    """Beat, every STATUS_REFRESH_SECONDS: silent nodes turn offline on every status page, and the
    cards of nodes where a slot or maintenance began or ended are sent again."""
    return len(refresh_status())


@shared_task(name="nodes.prune_usage", ignore_result=True)
def prune_usage() -> int:
    """Beat, hourly: per-minute telemetry older than TELEMETRY_MINUTES_KEEP_DAYS goes."""
    return usage_prune(timezone.now())


@shared_task(name="nodes.prune_events", ignore_result=True)
def prune_events() -> int:
    """Beat, hourly: agent events received more than NODE_EVENTS_KEEP_DAYS ago go, in batches."""
    return node_events_prune(timezone.now())


@shared_task(name="nodes.sync_broker_users", ignore_result=True)
def sync_broker_users() -> int:
    """Beat, every minute: the nodes' broker users that Redis lost (a restart without an ACL file) are made
    again from their stored hashes, so an agent is back on its queue within a minute. A broker that refuses
    raises: the job stays late, and the jobs-late alert says so."""
    return len(broker_users_sync().repaired)
