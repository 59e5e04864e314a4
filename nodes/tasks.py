"""Celery tasks of the portal for nodes: pushing lease snapshots to the agents, noticing silent ones."""

from __future__ import annotations

from celery import shared_task

from nodes.models import Node
from nodes.pushes import clear_pending, pushed_nodes, send_snapshot
from nodes.status import mark_offline_nodes


@shared_task(name="nodes.push_node_leases", ignore_result=True)
def push_node_leases(node_id: int) -> int | None:
    """Send one node its state. The pending mark goes first, so a change committed from now on
    schedules another push instead of being missed."""
    clear_pending(node_id)
    node = Node.objects.filter(pk=node_id).first()
    if node is None or not node.agent_token_hash:
        return None
    return send_snapshot(node)


@shared_task(name="nodes.push_all_leases", ignore_result=True)
def push_all_leases() -> int:
    """Beat, every minute: every node with an agent gets its whole state again."""
    nodes = pushed_nodes()
    for node in nodes:
        send_snapshot(node)
    return len(nodes)


@shared_task(name="nodes.mark_offline_nodes", ignore_result=True)
def mark_silent_nodes_offline() -> int:
    """Beat, every OFFLINE_CHECK_SECONDS: nodes silent too long turn offline on every status page."""
    return len(mark_offline_nodes())
