"""What node agents report: heartbeats, events and telemetry, stored as the latest state.

Every report that changes what the status page shows is broadcast to it once stored
(``nodes.status.broadcast_node_status``); events go to the admins following them.

A node reports only for itself: the view authenticates the node by its token, and every GPU
named in a report is looked up among *that* node's GPUs; anything else is ignored and named
back to the agent, never written.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from alerts.services import alerts_evaluate_readings, alerts_from_events, alerts_gpu_returned, alerts_node_online
from audit.services import audit_record
from live import broadcast
from nodes.history import history_record
from nodes.models import AgentState, Gpu, GpuTelemetry, Node, NodeEvent
from nodes.status import broadcast_node_status, broadcast_telemetry, node_online
from nodes.usage import usage_record

TELEMETRY_FIELDS = (*GpuTelemetry.READINGS, "processes")
EVENT_DETAIL_FIELDS = ("pid", "pids", "process", "version", "leases", "boundary", "drained")


def _gpus_by_uuid(node: Node) -> dict[str, Gpu]:
    return {gpu.uuid: gpu for gpu in Gpu.objects.filter(node=node)}


def agent_heartbeat_record(*, node: Node, data: dict[str, Any], now: datetime) -> tuple[AgentState, list[str]]:
    """Store the heartbeat; returns the state and the GPU UUIDs that are not this node's."""
    known = _gpus_by_uuid(node)
    acls = {uuid: sorted(users) for uuid, users in data.get("acls", {}).items() if uuid in known}
    ignored = sorted(set(data.get("acls", {})) - set(known))
    drained = [uuid for uuid in data.get("drained", []) if uuid in known]
    previous = AgentState.objects.filter(node=node).first()
    state, _ = AgentState.objects.update_or_create(
        node=node,
        defaults={
            "last_seen": now,
            "offline_since": None,
            "agent_version": data["agent_version"],
            "backend": data["backend"],
            "driver_version": data.get("driver_version") or "",
            "reported_hostname": data.get("hostname") or "",
            "applied_version": data["applied_version"],
            "acls": acls,
            "drained": drained,
            "clock_skew_seconds": (data["sent_at"] - now).total_seconds(),
        },
    )
    if _came_back(node, previous, now) or previous.drained != drained:
        broadcast_node_status([node.pk])  # telemetry broadcasts the rest
    return state, ignored


def _came_back(node: Node, previous: AgentState | None, now: datetime) -> bool:
    """After a report is stored: whether the node was silent before it (or never reported), so
    that every card changes. Its offline alert, if beat opened one, resolves."""
    if previous is not None and previous.offline_since is not None:
        alerts_node_online(node=node, now=now)
    return not node_online(previous, now)


def agent_events_record(*, node: Node, events: Iterable[dict[str, Any]]) -> tuple[int, list[str]]:
    """Store the events; an unkillable leftover drains its GPU. Returns (stored, ignored UUIDs)."""
    known = _gpus_by_uuid(node)
    rows, ignored, to_drain = [], set(), []
    for event in events:
        uuid = event.get("gpu") or ""
        gpu = known.get(uuid)
        if uuid and gpu is None:
            ignored.add(uuid)
        details = {key: event[key] for key in EVENT_DETAIL_FIELDS if key in event}
        rows.append(
            NodeEvent(
                node=node,
                gpu=gpu,
                kind=event["kind"],
                at=event["at"],
                user=event.get("user") or "",
                reservation_id=event.get("reservation"),
                message=event.get("message", ""),
                details=details,
            )
        )
        if event["kind"] == NodeEvent.Kind.UNKILLABLE and gpu is not None:
            pids = ", ".join(map(str, details.get("pids", [])))
            to_drain.append((gpu, f"processes of {event.get('user') or 'unknown'} could not be ended (pids {pids})"))
    with transaction.atomic():
        NodeEvent.objects.bulk_create(rows)
        for gpu, reason in to_drain:
            gpu_drain(gpu=gpu, reason=reason)
        alerts_from_events(node=node, events=rows, now=timezone.now())
        if rows:
            payload = {"type": "events", "node": node.name, "events": [event_data(row) for row in rows]}
            transaction.on_commit(lambda: broadcast.send_events(payload))
    return len(rows), sorted(ignored)


def event_data(event: NodeEvent) -> dict[str, Any]:
    """An event as admins see it live: what, when, which GPU, whose."""
    return {
        "kind": event.kind,
        "label": event.get_kind_display(),
        "at": event.at.isoformat(),
        "gpu": event.gpu.index if event.gpu else None,
        "user": event.user,
        "reservation": event.reservation_id,
        "message": event.message,
    }


def telemetry_record(*, node: Node, samples: Iterable[dict[str, Any]], now: datetime) -> tuple[int, list[str]]:
    """Upsert the latest reading of each of the node's GPUs in one statement; alerts look at it."""
    known = _gpus_by_uuid(node)
    rows, ignored = [], []
    for sample in samples:
        gpu = known.get(sample["uuid"])
        if gpu is None:
            ignored.append(sample["uuid"])
            continue
        rows.append(GpuTelemetry(gpu=gpu, at=now, **{field: sample.get(field) for field in TELEMETRY_FIELDS}))
    previous = AgentState.objects.filter(node=node).first()
    with transaction.atomic():
        GpuTelemetry.objects.bulk_create(
            rows, update_conflicts=True, unique_fields=["gpu"], update_fields=["at", *TELEMETRY_FIELDS]
        )
        AgentState.objects.filter(node=node).update(last_seen=now, offline_since=None)
        if _came_back(node, previous, now):
            broadcast_node_status([node.pk])
        else:
            broadcast_telemetry(node=node, readings=rows, now=now)
    usage_record(rows)
    alerts_evaluate_readings(node=node, readings=rows, now=now)
    history_record((row.gpu_id, now, row.utilization_pct) for row in rows)
    return len(rows), sorted(ignored)


def gpu_drain(*, gpu: Gpu, reason: str, actor: Any | None = None) -> None:
    """Take a GPU out of booking until an admin returns it (already drained: kept as it was)."""
    updated = Gpu.objects.filter(pk=gpu.pk, drained_at__isnull=True).update(
        drained_at=timezone.now(), drain_reason=reason[:500]
    )
    if updated:
        audit_record(actor=actor, action="gpu.drain", target=gpu, after={"reason": reason[:500]})
        broadcast_node_status([gpu.node_id])


def gpu_return_to_service(*, gpu: Gpu, actor: Any) -> bool:
    before = {"drained_at": gpu.drained_at.isoformat() if gpu.drained_at else None, "reason": gpu.drain_reason}
    updated = Gpu.objects.filter(pk=gpu.pk, drained_at__isnull=False).update(drained_at=None, drain_reason="")
    if updated:
        audit_record(actor=actor, action="gpu.undrain", target=gpu, before=before)
        broadcast_node_status([gpu.node_id])
        alerts_gpu_returned(gpu=gpu, actor=actor)
    return bool(updated)
