"""The fleet as it is now: one card per GPU, grouped by node, with its holder and next booking, as the
status page, the status API, /metrics and the live websocket updates show it (live/status.py sends them).

One builder (``fleet_status``) answers all three, in plain dicts built from three queries (four with
MIG cards) whatever the fleet's size, because it runs on every telemetry report (a node's cards are
rebuilt and broadcast each time). What a researcher sees is what an admin sees less the operational details
(``ADMIN_ONLY_*``): process ids, drain reasons and the agent's internals.

A GPU's ``state`` is decided here, once, in the order a person needs it:
offline > drained > maintenance > not bookable > in use > free.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.db.models import Q
from django.utils import timezone

from nodes.history import history_of
from nodes.liveness import node_online
from nodes.models import AgentState, GpuTelemetry, Node, card_share
from reservations import selectors
from reservations.models import Allocation, MaintenanceWindow

STATES = ("offline", "drained", "maintenance", "not_bookable", "in_use", "free")
ADMIN_ONLY_NODE_FIELDS = ("agent",)
ADMIN_ONLY_GPU_FIELDS = ("drain_reason",)
ADMIN_ONLY_PROCESS_FIELDS = ("pid",)


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


def reading_for_viewer(data: dict[str, Any] | None, admin: bool) -> dict[str, Any] | None:
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
        # Events past NODE_EVENTS_PER_MINUTE, counted but not stored (nodes/ingest.py).
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
    if not gpu.bookable or gpu.mig_change_at is not None or node.status == Node.Status.DISABLED:
        return "not_bookable"  # a card whose MIG layout changed waits for an admin (nodes/mig.py)
    return "in_use" if gpu.current_reservation is not None else "free"


def _online(node: Node, now: datetime) -> bool:
    """An agent's node while its agent reports; a Slurm node without our agent once Slurm has described it and
    while Slurm does not say it is down (its state shows beside it; a drained one is in maintenance)."""
    state = getattr(node, "agent_state", None)
    if node.manager == Node.Manager.SLURM and state is None:
        return bool(node.manager_state) and not node.manager_down
    return node_online(state, now)


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
    for maintenance in windows:
        target = gpu_window if maintenance.gpu_id else node_window
        target.setdefault(maintenance.gpu_id or maintenance.node_id, maintenance)

    cards: dict[int, list[dict[str, Any]]] = {}
    node_list = list(nodes)
    online = {node.pk: _online(node, now) for node in node_list}
    by_pk = {node.pk: node for node in node_list}
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
    _add_slices(cards, now=now, card_slices={gpu.pk: gpu.compute_slices for gpu in gpus if gpu.mig_mode})
    if history:
        recent = history_of([card["id"] for node_cards in cards.values() for card in node_cards])
        for node_cards in cards.values():
            for card in node_cards:
                card["history"] = recent.get(card["id"], [])
    result = []
    for node in node_list:
        state = getattr(node, "agent_state", None)
        result.append(
            {
                "name": node.name,
                "hostname": node.hostname,
                "status": node.status,
                "online": online[node.pk],
                "last_seen": _iso(state.last_seen if state else None),
                "manager": node.manager,
                "manager_state": node.manager_state,
                "maintenance": _window(node_window.get(node.pk)),
                "agent": _agent(state),
                "gpus": cards.get(node.pk, []),
            }
        )
    return result


def _add_slices(cards: dict[int, list[dict[str, Any]]], *, now: datetime, card_slices: dict[int, int]) -> None:
    """A MIG card's card lists its present slices with their holder, next booking and share of the card
    (one more query, only for a fleet with MIG cards), and a free card with a held slice is in use.
    ``card_slices``: the MIG cards' compute slices, by id."""
    if not card_slices:
        return
    slices = selectors.gpu_list(now=now).filter(parent_id__in=list(card_slices), gone_at__isnull=True)
    by_card: dict[int, list[dict[str, Any]]] = {}
    for piece in slices.order_by("parent_id", "placement_start"):
        by_card.setdefault(piece.card_id, []).append(
            {
                "id": piece.pk,
                "profile": piece.profile,
                "placement": piece.placement_start,
                "share": round(float(card_share(piece.compute_slices, card_slices[piece.card_id])), 4),
                "bookable": piece.bookable,
                "current": _slot(piece, "current"),
                "next": _slot(piece, "next"),
            }
        )
    for node_cards in cards.values():
        for card in node_cards:
            if card["id"] in by_card:
                card["slices"] = by_card[card["id"]]
                if card["state"] == "free" and any(piece["current"] for piece in card["slices"]):
                    card["state"] = "in_use"


def for_viewer(nodes: list[dict[str, Any]], *, admin: bool) -> list[dict[str, Any]]:
    """The cards as ``fleet_status`` built them (admins), or without the admin-only details."""
    if admin:
        return nodes
    shown = []
    for node in nodes:
        gpus = [
            {k: v for k, v in gpu.items() if k not in ADMIN_ONLY_GPU_FIELDS}
            | {"telemetry": reading_for_viewer(gpu["telemetry"], admin)}
            for gpu in node["gpus"]
        ]
        shown.append({k: v for k, v in node.items() if k not in ADMIN_ONLY_NODE_FIELDS} | {"gpus": gpus})
    return shown


def nodes_at_boundaries(*, since: datetime, now: datetime) -> set[int]:
    """Nodes where a booking or a maintenance window began or ended in (since, now]: their cards'
    holders, next bookings and states moved on with time alone."""
    passed = Q(start__gt=since, start__lte=now) | Q(end__gt=since, end__lte=now)
    turned = set(Allocation.objects.filter(passed, active=True).values_list("gpu__node_id", flat=True))
    turned |= set(MaintenanceWindow.objects.filter(passed).values_list("node_id", flat=True))
    return turned
