"""Keeping every open status page current: the cards of the nodes that changed, sent once committed.

The cards are built by reservations/fleet.py (the status page and API use the same builder); this
sends them: whole cards when a node's state, holders or bookings changed (live/receivers.py reacts to
bookings, reports, drains and admin edits), only the new readings on a plain telemetry report, and on
beat's refresh the cards that changed with time alone.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from live import broadcast
from nodes.liveness import nodes_mark_offline
from nodes.models import GpuTelemetry, Node
from reservations.fleet import fleet_status, for_viewer, nodes_at_boundaries, reading_data, reading_for_viewer

logger = logging.getLogger(__name__)


def broadcast_node_status(node_ids: Iterable[int] | None) -> None:
    """Once the current transaction commits, send the nodes' fresh cards to every status page;
    ``None``: the whole fleet, replacing what pages show (a node was deleted)."""
    ids = None if node_ids is None else sorted(set(node_ids))
    if ids != []:
        transaction.on_commit(lambda: _send_node_status(ids))


def _send_node_status(node_ids: list[int] | None) -> None:
    try:
        nodes = fleet_status(node_ids=node_ids)
    except Exception:  # a failed broadcast must never fail the report or booking that caused it
        logger.exception("could not build the status of nodes %s for broadcasting", node_ids)
        return
    message = {"type": "nodes", "full": node_ids is None, "now": timezone.now().isoformat()}
    broadcast.send_status(
        admin={**message, "nodes": nodes},
        user={**message, "nodes": for_viewer(nodes, admin=False)},
    )


def broadcast_telemetry(*, node: Node, readings: list[GpuTelemetry], now: datetime) -> None:
    """Once committed, send a node's new readings: the cards' other fields have not changed (a node
    back from offline, a booking or a slot boundary sends its whole cards instead). Built from the
    readings in hand, without a query: this runs for every report of every node."""
    data = {reading.gpu_id: reading_data(reading) for reading in readings}

    def cut(admin: bool) -> dict[str, Any]:
        gpus = {str(gpu_id): reading_for_viewer(reading, admin) for gpu_id, reading in data.items()}
        return {"last_seen": now.isoformat(), "gpus": gpus}

    transaction.on_commit(lambda: broadcast.send_telemetry(node=node.name, admin=cut(True), user=cut(False)))


def refresh_status(now: datetime | None = None) -> list[int]:
    """Beat, every STATUS_REFRESH_SECONDS: re-send the cards that changed with time alone.

    - Agents silent for AGENT_OFFLINE_AFTER_SECONDS are marked offline, once (nodes/liveness.py,
      whose announcement opens their "offline" alerts); their cards go out with the others below.
    - Nodes where a booking or a maintenance window began or ended since the last run: their
      holders, next bookings and states moved on.

    Returns the ids of the nodes re-sent.
    """
    now = now or timezone.now()
    offline = nodes_mark_offline(now)
    # A little overlap with the previous run: a boundary re-sent twice costs nothing.
    since = now - timedelta(seconds=settings.STATUS_REFRESH_SECONDS + 2)
    ids = sorted(set(offline) | nodes_at_boundaries(since=since, now=now))
    broadcast_node_status(ids)
    return ids
