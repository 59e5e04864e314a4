"""Keeping every open status page current: the cards of the nodes that changed, sent once committed.

The cards are built by reservations/fleet.py (the status page and API use the same builder); this
sends them: whole cards when a node's state, holders or bookings changed (live/receivers.py reacts to
bookings, reports, drains and admin edits), only the new readings on a plain telemetry report, and on
beat's refresh the cards that changed with time alone.

A booking's cards are built by a worker, not by the request that booked (``broadcast_node_status_soon``):
rebuilding a node's cards costs more than the booking itself, and a burst of bookings on one node needs
one rebuild, not one each. The first change sets a short-lived "status pending" mark in Redis and queues
the rebuild ``LIVE_STATUS_COALESCE_SECONDS`` later; the changes that follow while the mark is set ride on
it, because the task clears the mark before it reads the database (as lease pushes coalesce:
reservations/pushes.py). With Redis or the broker away, the request builds the cards itself.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from celery import shared_task
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from kernel.outages import outage_of
from kernel.redis_client import redis_client
from live import broadcast
from nodes.ingest import TelemetryReport
from nodes.liveness import nodes_mark_offline
from reservations.fleet import fleet_status, for_viewer, nodes_at_boundaries, reading_data, reading_for_viewer

logger = logging.getLogger(__name__)

PENDING_KEY = "gpubook:status-pending:{node_id}"
STATUS_EXPIRES_SECONDS = 600


def broadcast_node_status(node_ids: Iterable[int] | None) -> None:
    """Once the current transaction commits, send the nodes' fresh cards to every status page;
    ``None``: the whole fleet, replacing what pages show (a node was deleted)."""
    ids = None if node_ids is None else sorted(set(node_ids))
    if ids != []:
        transaction.on_commit(lambda: _send_node_status(ids))


def broadcast_node_status_soon(node_ids: Iterable[int]) -> None:
    """Once the current transaction commits, have a worker send the nodes' fresh cards within
    LIVE_STATUS_COALESCE_SECONDS, coalesced with every other change meanwhile (0: at once, here)."""
    ids = sorted(set(node_ids))
    if not ids:
        return
    if settings.LIVE_STATUS_COALESCE_SECONDS <= 0:
        broadcast_node_status(ids)
        return
    transaction.on_commit(lambda: _request_node_status(ids))


def _request_node_status(node_ids: list[int]) -> None:
    delay = settings.LIVE_STATUS_COALESCE_SECONDS
    marked: list[int] = []
    try:
        client = redis_client()
        # The mark outlives the queued task by a margin, so a lost task cannot hold the node's cards back for long.
        for node_id in node_ids:
            if client.set(PENDING_KEY.format(node_id=node_id), "1", nx=True, ex=max(int(delay * 10), 10)):
                marked.append(node_id)
        if marked:
            # A busy worker still sends them (a worker more than STATUS_EXPIRES_SECONDS behind drops them).
            send_node_status.apply_async((marked,), countdown=delay, expires=STATUS_EXPIRES_SECONDS)
    except Exception:
        logger.warning("could not queue the status of nodes %s; building it here", node_ids, exc_info=True)
        _clear_marks(marked)  # no task behind them: the next change must not ride on them
        _send_node_status(node_ids)


def _clear_marks(node_ids: list[int]) -> None:
    if not node_ids:
        return
    try:
        redis_client().delete(*(PENDING_KEY.format(node_id=node_id) for node_id in node_ids))
    except Exception:  # they expire by themselves
        logger.warning("could not clear the status marks of nodes %s", node_ids, exc_info=True)


# Given back when its pool process is killed under it (portal/settings.py): a few nodes' cards, which nothing
# else sends before the next change or refresh.
@shared_task(name="live.send_node_status", ignore_result=True, reject_on_worker_lost=True)
def send_node_status(node_ids: list[int]) -> None:
    """The worker's side of ``broadcast_node_status_soon``: clear the marks, then read and send."""
    _clear_marks(node_ids)
    _send_node_status(node_ids)


def _send_node_status(node_ids: list[int] | None) -> None:
    try:
        nodes = fleet_status(node_ids=node_ids)
    except Exception as error:  # a failed broadcast must never fail the report or booking that caused it
        if outage_of(error) is None:
            logger.exception("could not build the status of nodes %s for broadcasting", node_ids)
        else:  # the database away (kernel/outages.py): no trace, the next change or refresh sends them
            logger.warning("could not build the status of nodes %s for broadcasting: %s", node_ids, error)
        return
    message = {"type": "nodes", "full": node_ids is None, "now": timezone.now().isoformat()}
    broadcast.send_status(
        admin={**message, "nodes": nodes},
        user={**message, "nodes": for_viewer(nodes, admin=False)},
    )


def broadcast_telemetry(reports: list[TelemetryReport], *, at_once: bool = False) -> None:
    """Once committed, send these reports' new readings in one message (the newest report of each node
    wins): the cards' other fields have not changed (a node back from offline, a booking or a slot
    boundary sends its whole cards instead). Built from the readings in hand, without a query: this runs
    for every report of every node. The ingest process hands over its whole batch, already spaced
    (``at_once``), so the pages get one message per batch; reports stored one by one by a web process are
    spaced by live.broadcast._TelemetryBatch."""
    nodes = {report.node.name: _telemetry_cuts(report) for report in reports}
    if nodes:
        transaction.on_commit(lambda: broadcast.send_telemetry(nodes, at_once=at_once))


def _telemetry_cuts(report: TelemetryReport) -> tuple[dict[str, Any], dict[str, Any]]:
    """A report's readings in the admin and the researcher cut."""
    data = {str(reading.gpu_id): reading_data(reading) for reading in report.readings}

    def cut(admin: bool) -> dict[str, Any]:
        gpus = {gpu_id: reading_for_viewer(reading, admin) for gpu_id, reading in data.items()}
        return {"last_seen": report.now.isoformat(), "gpus": gpus}

    return cut(True), cut(False)


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
