"""The fleet as it is now: one card per GPU, grouped by node, as the status page, the status API and
the live websocket updates show it.

One builder (``fleet_status``) answers all three, in plain dicts built from three queries whatever
the fleet's size, because it runs on every telemetry report (a node's cards are rebuilt and
broadcast each time). What a researcher sees is what an admin sees less the operational details
(``ADMIN_ONLY_*``): process ids, drain reasons and the agent's internals.

A GPU's ``state`` is decided here, once, in the order a person needs it:
offline > drained > maintenance > not bookable > in use > free.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from alerts.services import alerts_nodes_offline
from live import broadcast
from nodes import selectors
from nodes.history import history_of
from nodes.models import AgentState, GpuTelemetry, Node
from reservations.models import Allocation, MaintenanceWindow

logger = logging.getLogger(__name__)

STATES = ("offline", "drained", "maintenance", "not_bookable", "in_use", "free")
ADMIN_ONLY_NODE_FIELDS = ("agent",)
ADMIN_ONLY_GPU_FIELDS = ("drain_reason",)
ADMIN_ONLY_PROCESS_FIELDS = ("pid",)


def node_online(state: AgentState | None, now: datetime) -> bool:
    """Reported within AGENT_OFFLINE_AFTER_SECONDS and not marked offline since."""
    return (
        state is not None
        and state.offline_since is None
        and now - state.last_seen < timedelta(seconds=settings.AGENT_OFFLINE_AFTER_SECONDS)
    )


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment is not None else None


def _slot(gpu: Any, prefix: str) -> dict[str, Any] | None:
    reservation = getattr(gpu, f"{prefix}_reservation")
    if reservation is None:
        return None
    return {
        "reservation": reservation,
        "user": getattr(gpu, f"{prefix}_user"),
        "start": _iso(getattr(gpu, f"{prefix}_start")),
        "end": _iso(getattr(gpu, f"{prefix}_end")),
    }


def _window(window: MaintenanceWindow | None) -> dict[str, Any] | None:
    if window is None:
        return None
    return {"start": _iso(window.start), "end": _iso(window.end), "reason": window.reason}


def _telemetry(gpu: Any) -> dict[str, Any] | None:
    try:
        reading = gpu.telemetry
    except AttributeError:  # no reading yet (the reverse one-to-one raises a subclass of it)
        return None
    return reading_data(reading)


def reading_data(reading: GpuTelemetry) -> dict[str, Any]:
    data: dict[str, Any] = {"at": _iso(reading.at)}
    data.update({field: getattr(reading, field) for field in GpuTelemetry.READINGS})
    data["processes"] = [
        {"pid": p.get("pid"), "user": p.get("user") or "", "used_memory_mib": p.get("used_memory_mib")}
        for p in reading.processes or []
        if isinstance(p, dict)
    ]
    return data


def _reading_for_viewer(data: dict[str, Any] | None, admin: bool) -> dict[str, Any] | None:
    if data is None or admin:
        return data
    processes = [{k: v for k, v in p.items() if k not in ADMIN_ONLY_PROCESS_FIELDS} for p in data["processes"]]
    return {**data, "processes": processes}


def _agent(state: AgentState | None) -> dict[str, Any] | None:
    if state is None:
        return None
    return {
        "version": state.agent_version,
        "backend": state.backend,
        "driver_version": state.driver_version,
        "applied_lease_version": state.applied_version,
        "clock_skew_seconds": state.clock_skew_seconds,
        # Events past NODE_EVENTS_PER_MINUTE, counted but not stored (nodes/reports.py).
        "events_dropped": state.events_dropped,
        "events_dropped_at": _iso(state.events_dropped_at),
    }


def _gpu_state(*, online: bool, node: Node, gpu: Any, window: MaintenanceWindow | None) -> str:
    if not online:
        return "offline"
    if gpu.drained_at is not None:
        return "drained"
    if window is not None or node.status == Node.Status.MAINTENANCE:
        return "maintenance"
    if not gpu.bookable or node.status == Node.Status.DISABLED:
        return "not_bookable"
    return "in_use" if gpu.current_reservation is not None else "free"


def fleet_status(
    *, now: datetime | None = None, node_ids: Iterable[int] | None = None, history: bool = False
) -> list[dict[str, Any]]:
    """Every node (or those of ``node_ids``) with its GPUs' cards, in full (admin) detail; with
    ``history``, each card also carries its last minutes of utilisation (nodes.history)."""
    now = now or timezone.now()
    nodes = Node.objects.select_related("agent_state").order_by("name")
    gpus = selectors.gpu_list(now=now).filter(parent__isnull=True).select_related("telemetry")
    windows = MaintenanceWindow.objects.filter(start__lte=now, end__gt=now).order_by("end")
    if node_ids is not None:
        ids = list(node_ids)
        nodes, gpus, windows = nodes.filter(pk__in=ids), gpus.filter(node_id__in=ids), windows.filter(node_id__in=ids)

    node_window: dict[int, MaintenanceWindow] = {}
    gpu_window: dict[int, MaintenanceWindow] = {}
    for window in windows:
        target = gpu_window if window.gpu_id else node_window
        target.setdefault(window.gpu_id or window.node_id, window)

    cards: dict[int, list[dict[str, Any]]] = {}
    nodes = list(nodes)
    online = {node.pk: node_online(getattr(node, "agent_state", None), now) for node in nodes}
    by_pk = {node.pk: node for node in nodes}
    for gpu in gpus:
        node = by_pk.get(gpu.node_id)
        if node is None:
            continue
        window = gpu_window.get(gpu.pk) or node_window.get(gpu.node_id)
        cards.setdefault(gpu.node_id, []).append(
            {
                "id": gpu.pk,
                "index": gpu.index,
                "uuid": gpu.uuid,
                "model": gpu.model,
                "memory_mib": gpu.memory_mib,
                "state": _gpu_state(online=online[node.pk], node=node, gpu=gpu, window=window),
                "bookable": gpu.bookable,
                "drained": gpu.drained_at is not None,
                "drain_reason": gpu.drain_reason,
                "maintenance": _window(window),
                "current": _slot(gpu, "current"),
                "next": _slot(gpu, "next"),
                "telemetry": _telemetry(gpu),
            }
        )
    if history:
        recent = history_of([card["id"] for node_cards in cards.values() for card in node_cards])
        for node_cards in cards.values():
            for card in node_cards:
                card["history"] = recent.get(card["id"], [])
    result = []
    for node in nodes:
        state = getattr(node, "agent_state", None)
        result.append(
            {
                "name": node.name,
                "hostname": node.hostname,
                "status": node.status,
                "online": online[node.pk],
                "last_seen": _iso(state.last_seen if state else None),
                "maintenance": _window(node_window.get(node.pk)),
                "agent": _agent(state),
                "gpus": cards.get(node.pk, []),
            }
        )
    return result


def for_viewer(nodes: list[dict[str, Any]], *, admin: bool) -> list[dict[str, Any]]:
    """The cards as ``fleet_status`` built them (admins), or without the admin-only details."""
    if admin:
        return nodes
    shown = []
    for node in nodes:
        gpus = [
            {k: v for k, v in gpu.items() if k not in ADMIN_ONLY_GPU_FIELDS}
            | {"telemetry": _reading_for_viewer(gpu["telemetry"], admin)}
            for gpu in node["gpus"]
        ]
        shown.append({k: v for k, v in node.items() if k not in ADMIN_ONLY_NODE_FIELDS} | {"gpus": gpus})
    return shown


# --- broadcasting ---------------------------------------------------------------------------


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
        gpus = {str(gpu_id): _reading_for_viewer(reading, admin) for gpu_id, reading in data.items()}
        return {"last_seen": now.isoformat(), "gpus": gpus}

    transaction.on_commit(lambda: broadcast.send_telemetry(node=node.name, admin=cut(True), user=cut(False)))


def refresh_status(now: datetime | None = None) -> list[int]:
    """Beat, every STATUS_REFRESH_SECONDS: re-send the cards that changed with time alone.

    - Agents silent for AGENT_OFFLINE_AFTER_SECONDS are marked offline, once. The update repeats
      the silence condition, so an agent that reports meanwhile is not marked. Each opens an
      "offline" alert (alerts/), resolved by the node's next report.
    - Nodes where a booking or a maintenance window began or ended since the last run: their
      holders, next bookings and states moved on.

    Returns the ids of the nodes re-sent.
    """
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.AGENT_OFFLINE_AFTER_SECONDS)
    silent = AgentState.objects.filter(last_seen__lt=cutoff, offline_since__isnull=True)
    offline = list(silent.values_list("node_id", flat=True))
    if offline:
        silent.filter(node_id__in=offline).update(offline_since=now)
        alerts_nodes_offline(node_ids=offline, now=now)

    # A little overlap with the previous run: a boundary re-sent twice costs nothing.
    since = now - timedelta(seconds=settings.STATUS_REFRESH_SECONDS + 2)
    passed = Q(start__gt=since, start__lte=now) | Q(end__gt=since, end__lte=now)
    turned = set(Allocation.objects.filter(passed, active=True).values_list("gpu__node_id", flat=True))
    turned |= set(MaintenanceWindow.objects.filter(passed).values_list("node_id", flat=True))

    ids = sorted(set(offline) | turned)
    broadcast_node_status(ids)
    return ids
