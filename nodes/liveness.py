"""Whether a node's agent is alive: reported within AGENT_OFFLINE_AFTER_SECONDS and not marked offline.

Agents report every few seconds; a node silent for longer is marked offline once (by beat, through
``nodes_mark_offline``), and its next report marks it back (nodes/ingest.py). Both are announced
(``nodes_went_offline``, ``node_back_online``): alerts open and resolve the "offline" alert, live
re-sends the node's cards.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings

from nodes.models import AgentState, Node
from nodes.signals import nodes_went_offline


def node_online(state: AgentState | None, now: datetime) -> bool:
    """Reported within AGENT_OFFLINE_AFTER_SECONDS and not marked offline since."""
    return (
        state is not None
        and state.offline_since is None
        and now - state.last_seen < timedelta(seconds=settings.AGENT_OFFLINE_AFTER_SECONDS)
    )


def nodes_mark_offline(now: datetime) -> list[int]:
    """Mark the nodes silent for AGENT_OFFLINE_AFTER_SECONDS offline, once; returns their ids.

    The update repeats the silence condition, so an agent that reports meanwhile is not marked."""
    cutoff = now - timedelta(seconds=settings.AGENT_OFFLINE_AFTER_SECONDS)
    silent = AgentState.objects.filter(last_seen__lt=cutoff, offline_since__isnull=True)
    offline = list(silent.values_list("node_id", flat=True))
    if offline:
        silent.filter(node_id__in=offline).update(offline_since=now)
        nodes_went_offline.send(sender=Node, node_ids=offline, now=now)
    return offline
