"""What node agents report: heartbeats, events and telemetry, stored as the latest state.

Each report, once stored, is announced (nodes/signals.py): alerts look at it, live sends the status
pages what changed. Nothing here calls those apps: they sit above nodes.

A node reports only for itself: the view authenticates the node by its token, and every GPU
named in a report is looked up among *that* node's GPUs; anything else is ignored and named
back to the agent, never written.

Events are stored within a budget per node (NODE_EVENTS_PER_MINUTE) and kept NODE_EVENTS_KEEP_DAYS;
past the budget they are counted, not stored, but those that drain GPUs and open or resolve alerts
still act (``agent_events_record``). Heartbeats are also when alerts check that beat's periodic jobs
run (a receiver of ``node_reported``): they arrive every few seconds whether beat lives or not.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F, Value
from django.db.models.functions import Greatest
from django.utils import timezone

from nodes.energy import counters_before, energy_minutes
from nodes.history import history_record
from nodes.liveness import node_online
from nodes.mig import mig_layout_record
from nodes.models import AgentState, Gpu, GpuTelemetry, Node, NodeEvent
from nodes.services import gpu_drain
from nodes.signals import node_back_online, node_events_recorded, node_reported, telemetry_received
from nodes.usage import usage_record

logger = logging.getLogger(__name__)

TELEMETRY_FIELDS = (*GpuTelemetry.READINGS, "processes")
EVENT_DETAIL_FIELDS = (
    "pid",
    "pids",
    "process",
    "version",
    "leases",
    "boundary",
    "drained",
    "power_limit_w",
    "launch",
    "exit_code",
)
# Events that act: an unkillable leftover drains its GPU, and these open or resolve alerts
# (the receivers of node_events_recorded). Past the node's budget they are stored first, and act even
# when not stored.
ACTING_EVENTS = frozenset(
    {
        NodeEvent.Kind.UNKILLABLE,
        NodeEvent.Kind.VIOLATION,
        NodeEvent.Kind.LEFTOVER,
        NodeEvent.Kind.LEASE_REFUSED,
        NodeEvent.Kind.ENDED,
        NodeEvent.Kind.DRAIN_CLEARED,
        NodeEvent.Kind.GRANTED,
    }
)
# Past the budget, acting events act once per (kind, GPU, user) of a report, for at most this many
# of them: a node in trouble names a few; thousands of made-up users are only counted.
ACTING_PAST_BUDGET = 50
PRUNE_BATCH = 5000


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
    layout_changed = "mig" in data and mig_layout_record(node=node, cards=data["mig"], known=known, now=now)
    cards_changed = (
        _came_back(node, previous, now) or (previous is not None and previous.drained != drained) or layout_changed
    )
    node_reported.send(sender=Node, node=node, now=now, cards_changed=cards_changed, launches=data.get("launches", []))
    return state, ignored


def _came_back(node: Node, previous: AgentState | None, now: datetime) -> bool:
    """After a report is stored: whether the node was silent before it (or never reported), so
    that every card changes. A node that beat had marked offline is announced back online."""
    if previous is not None and previous.offline_since is not None:
        node_back_online.send(sender=Node, node=node, now=now)
    return not node_online(previous, now)


def agent_events_record(*, node: Node, events: Iterable[dict[str, Any]]) -> tuple[int, list[str]]:
    """Store the events within the node's budget, and act on them: an unkillable leftover drains
    its GPU, and alerts open or resolve. Returns (stored, ignored UUIDs).

    Past NODE_EVENTS_PER_MINUTE the rest are counted in the node's agent state, not stored; acting
    events are stored first, and past the budget still act, once per (kind, GPU, user) of the
    report and for at most ACTING_PAST_BUDGET of them."""
    known = _gpus_by_uuid(node)
    rows, ignored = [], set()
    for event in events:
        uuid = event.get("gpu") or ""
        gpu = known.get(uuid)
        if uuid and gpu is None:
            ignored.add(uuid)
        rows.append(
            NodeEvent(
                node=node,
                gpu=gpu,
                kind=event["kind"],
                at=event["at"],
                user=event.get("user") or "",
                reservation_id=event.get("reservation"),
                message=event.get("message", ""),
                details={key: event[key] for key in EVENT_DETAIL_FIELDS if key in event},
            )
        )
    now = timezone.now()
    with transaction.atomic():
        allowed = _spend_event_budget(node, len(rows), now)
        if allowed < len(rows):
            rows.sort(key=lambda row: row.kind not in ACTING_EVENTS)  # stable: acting events first
        stored, past = rows[:allowed], rows[allowed:]
        acting = stored + _acting_past_budget(past)
        NodeEvent.objects.bulk_create(stored)
        for row in acting:
            if row.kind == NodeEvent.Kind.UNKILLABLE and row.gpu is not None:
                pids = ", ".join(map(str, row.details.get("pids", [])))
                # The agent's words say which process and why (still running after SIGKILL, or run as root).
                reason = row.message or f"processes of {row.user or 'unknown'} could not be ended (pids {pids})"
                gpu_drain(gpu=row.gpu, reason=reason)
        node_events_recorded.send(sender=Node, node=node, stored=stored, acting=acting, now=now)
    return len(stored), sorted(ignored)


def _spend_event_budget(node: Node, asked: int, now: datetime) -> int:
    """How many of ``asked`` events the node may store now: NODE_EVENTS_PER_MINUTE per minute of the
    portal's clock. The rest are counted as dropped. The node's agent state row is locked, so two
    reports of one node at once share one budget; a node that never sent a heartbeat gets a state
    marked offline (its events are not a sign that it enforces anything)."""
    if not asked:
        return 0
    AgentState.objects.get_or_create(node=node, defaults={"last_seen": now, "offline_since": now})
    state = AgentState.objects.select_for_update().get(node=node)
    minute = now.replace(second=0, microsecond=0)
    used = state.events_in_minute if state.events_minute == minute else 0
    allowed = max(0, min(asked, settings.NODE_EVENTS_PER_MINUTE - used))
    dropped = asked - allowed
    changes: dict[str, Any] = {"events_minute": minute, "events_in_minute": used + allowed}
    if dropped:
        changes |= {"events_dropped": F("events_dropped") + dropped, "events_dropped_at": now}
        if used < settings.NODE_EVENTS_PER_MINUTE:  # once a minute, not once a report
            logger.warning(
                "node %s sent more than NODE_EVENTS_PER_MINUTE=%s events this minute: the rest are counted, not stored",
                node.name,
                settings.NODE_EVENTS_PER_MINUTE,
            )
    AgentState.objects.filter(pk=state.pk).update(**changes)
    return allowed


def _acting_past_budget(rows: list[NodeEvent]) -> list[NodeEvent]:
    """The events past the budget that still act: the first of each (kind, GPU, user)."""
    seen: set[tuple[str, int | None, str]] = set()
    acting = []
    for row in rows:
        subject = (row.kind, row.gpu_id, row.user)
        if row.kind not in ACTING_EVENTS or subject in seen:
            continue
        if len(seen) >= ACTING_PAST_BUDGET:
            break
        seen.add(subject)
        acting.append(row)
    return acting


def node_events_prune(now: datetime) -> int:
    """Delete events received more than NODE_EVENTS_KEEP_DAYS ago (0: keep them), in batches so no
    statement locks the table for long; returns how many went. Idempotent."""
    if settings.NODE_EVENTS_KEEP_DAYS <= 0:
        return 0
    old = NodeEvent.objects.filter(received_at__lt=now - timedelta(days=settings.NODE_EVENTS_KEEP_DAYS))
    deleted = 0
    while True:
        batch = list(old.order_by().values_list("pk", flat=True)[:PRUNE_BATCH])
        if batch:
            deleted += NodeEvent.objects.filter(pk__in=batch).delete()[0]
        if len(batch) < PRUNE_BATCH:
            return deleted


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


@dataclass(frozen=True)
class TelemetryReport:
    """One telemetry report as stored: its node, one reading per known GPU (in the report's order), when
    the portal received it, and whether the node was silent before it (every card changes then)."""

    node: Node
    readings: list[GpuTelemetry]
    now: datetime
    came_back: bool


def telemetry_record(*, node: Node, samples: Iterable[dict[str, Any]], now: datetime) -> tuple[int, list[str]]:
    """Store one report (see ``telemetry_batch_record``); returns (readings stored, UUIDs not this node's)."""
    reports, ignored = telemetry_batch_record([(node.pk, list(samples), now)])
    return sum(len(report.readings) for report in reports), ignored[0]


def telemetry_batch_record(
    batch: Sequence[tuple[int, list[dict[str, Any]], datetime]], *, queued: bool = False
) -> tuple[list[TelemetryReport], list[list[str]]]:
    """Store reports (node id, samples, received at), oldest first, in one transaction: each GPU's latest
    reading upserted once, the readings folded into their minutes (nodes/usage.py), the nodes' agent
    states marked seen; alerts look at every report in order, inside the transaction (so a batch that
    rolls back leaves no streak counted). Returns the reports stored (those of deleted nodes are left
    out) and, for each report given, the UUIDs that are not its node's. After commit, live sends the
    readings and the sparklines' history is appended.

    The web process calls this with one report at a time (TELEMETRY_INGEST=inline), the telemetry
    consumer with all the reports waiting (nodes/telemetry_queue.py: ``queued``, its batches already spaced
    TELEMETRY_BATCH_WAIT_MS apart); the results are the same."""
    node_ids = {node_id for node_id, _, _ in batch}
    nodes = Node.objects.in_bulk(node_ids)
    known: dict[int, dict[str, Gpu]] = {node_id: {} for node_id in node_ids}
    for gpu in Gpu.objects.filter(node_id__in=node_ids):
        known[gpu.node_id][gpu.uuid] = gpu
    with transaction.atomic():
        # Locked, in one order, so that beat marking a node offline meanwhile is seen (or waits).
        states = AgentState.objects.select_for_update().filter(node_id__in=node_ids).order_by("node_id")
        previous = {state.node_id: state for state in states}
        reports: list[TelemetryReport] = []
        ignored: list[list[str]] = []
        seen: dict[int, datetime] = {}
        for node_id, samples, now in batch:
            gpus = known[node_id]
            ignored.append(sorted(sample["uuid"] for sample in samples if sample["uuid"] not in gpus))
            if node_id not in nodes:
                continue
            readings = [
                GpuTelemetry(gpu=gpus[sample["uuid"]], at=now, **{key: sample.get(key) for key in TELEMETRY_FIELDS})
                for sample in samples
                if sample["uuid"] in gpus
            ]
            # A report says the node is alive only if it is newer than what was last known of it: one that
            # waited in the queue while the node went silent and was marked offline brings nothing back.
            state = previous.get(node_id)
            fresh = state is None or (
                now > state.last_seen and (state.offline_since is None or now >= state.offline_since)
            )
            came_back = fresh and node_id not in seen and _came_back(nodes[node_id], state, now)
            if fresh:  # the node's later reports in the batch find it online
                seen[node_id] = max(seen.get(node_id, now), now)
            reports.append(TelemetryReport(node=nodes[node_id], readings=readings, now=now, came_back=came_back))
        rows = [reading for report in reports for reading in report.readings]
        latest = {reading.gpu_id: reading for reading in rows}  # each GPU's last reading of the batch
        counting = {row.gpu_id for row in rows if row.energy_mj is not None}
        energy = energy_minutes(rows, counters_before(counting)) if counting else None
        GpuTelemetry.objects.bulk_create(
            latest.values(), update_conflicts=True, unique_fields=["gpu"], update_fields=["at", *TELEMETRY_FIELDS]
        )
        _mark_seen(previous, seen)
        usage_record(rows, energy)
        if reports:
            telemetry_received.send(sender=Node, reports=reports, queued=queued)
        # The sparklines' points once committed: a batch that rolls back and is stored again adds them once.
        points = [(row.gpu_id, row.at, row.utilization_pct) for row in rows]
        transaction.on_commit(lambda: history_record(points))
    return reports, ignored


def _mark_seen(states: dict[int, AgentState], seen: dict[int, datetime]) -> None:
    """The agent states of the nodes (those that have one) seen at the given times, and not offline: never
    earlier than a heartbeat stored meanwhile."""
    changed = []
    for node_id, now in seen.items():
        state = states.get(node_id)
        if state is not None:
            state.last_seen, state.offline_since = Greatest(F("last_seen"), Value(now)), None
            changed.append(state)
    AgentState.objects.bulk_update(changed, ["last_seen", "offline_since"])
