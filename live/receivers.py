"""Everything that changes what open pages show reaches them from here, once it has committed.

- Calendars (topic "calendar"), all in this module: a booking's change names the period it touched;
  admin edits of maintenance windows, nodes and GPUs (Django admin saves them directly, so their
  model signals are caught) reload the period or, when rows appear or vanish, the whole calendar.
- Status cards (topics "status"; live/status.py): bookings, reports, drains, returns and admin edits.
- Agent events (topic "events") and alerts (topic "alerts").

Each reacts to the announcement of the app below (reservations/signals.py, nodes/signals.py,
alerts/signals.py) in its on-commit phase: a rolled-back change sends nothing.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import transaction
from django.db.models.signals import m2m_changed, post_delete, post_save
from django.dispatch import receiver

from alerts.selectors import alerts_data
from alerts.signals import alert_changed
from live import broadcast
from live.status import broadcast_node_status, broadcast_node_status_soon, broadcast_telemetry
from nodes.ingest import TelemetryReport, event_data
from nodes.models import Gpu, Node, NodeEvent
from nodes.signals import gpu_drained, gpu_returned, node_events_recorded, node_reported, telemetry_received
from reservations.models import MaintenanceWindow, Reservation, ReservedCapacity
from reservations.signals import reservation_changed, reserved_capacity_released

logger = logging.getLogger(__name__)

# --- calendars ---------------------------------------------------------------------------------


def _calendar_after_commit(*, node: str | None, start: Any = None, end: Any = None) -> None:
    start_text, end_text = (start.isoformat() if start else None), (end.isoformat() if end else None)
    transaction.on_commit(lambda: broadcast.send_calendar_change(node=node, start=start_text, end=end_text))


@receiver(reservation_changed.on_commit)
def booking_changed(
    sender: type, reservation: Reservation, after: dict[str, Any], touched_start: str, touched_end: str, **kwargs: Any
) -> None:
    broadcast_node_status_soon([reservation.node_id])  # built by a worker, coalesced (live/status.py)
    broadcast.send_calendar_change(node=after["node"], start=touched_start, end=touched_end)


@receiver([post_save, post_delete], sender=MaintenanceWindow)
def maintenance_changed(sender: Any, instance: MaintenanceWindow, **kwargs: Any) -> None:
    node = Node.objects.filter(pk=instance.node_id).values_list("name", flat=True).first()
    _calendar_after_commit(node=node, start=instance.start, end=instance.end)
    broadcast_node_status([instance.node_id])


@receiver([post_save, post_delete], sender=ReservedCapacity)
def reserved_capacity_changed(sender: Any, instance: ReservedCapacity, **kwargs: Any) -> None:
    # A repeating window reaches far beyond its first occurrence: the node's calendars reload whatever they show.
    # A count of a model (no node) shows on every node that has the model: every calendar reloads.
    node = Node.objects.filter(pk=instance.node_id).values_list("name", flat=True).first() if instance.node_id else None
    _calendar_after_commit(node=node)


@receiver(m2m_changed, sender=ReservedCapacity.gpus.through)
def reserved_gpus_changed(sender: Any, instance: Any, action: str, **kwargs: Any) -> None:
    if action.startswith("post_") and isinstance(instance, ReservedCapacity):
        reserved_capacity_changed(sender=ReservedCapacity, instance=instance)


@receiver(reserved_capacity_released.on_commit)
def reserved_capacity_freed(sender: type, node: Node | None, start: Any, end: Any, **kwargs: Any) -> None:
    # The band of a released occurrence goes from the calendars (every node's, for a count of a model).
    broadcast.send_calendar_change(node=node.name if node else None, start=start.isoformat(), end=end.isoformat())


@receiver([post_save, post_delete], sender=Node)
def node_changed(sender: Any, instance: Node, **kwargs: Any) -> None:
    # Rows appear, vanish or change their names: every calendar reloads.
    _calendar_after_commit(node=None)
    broadcast_node_status(None if kwargs["signal"] is post_delete else [instance.pk])


@receiver([post_save, post_delete], sender=Gpu)
def gpu_changed(sender: Any, instance: Gpu, **kwargs: Any) -> None:
    _calendar_after_commit(node=None)
    broadcast_node_status([instance.node_id])


# --- status cards and events -------------------------------------------------------------------


@receiver(node_reported.on_commit)
def heartbeat_stored(sender: type, node: Node, cards_changed: bool, **kwargs: Any) -> None:
    if cards_changed:  # otherwise telemetry refreshes the cards
        broadcast_node_status([node.pk])


@receiver(telemetry_received.on_commit)
def readings_stored(sender: type, reports: list[TelemetryReport], queued: bool = False, **kwargs: Any) -> None:
    back = [report.node.pk for report in reports if report.came_back]
    if back:  # every card of these nodes changes, not only the readings
        broadcast_node_status(back)
    broadcast_telemetry([report for report in reports if report.node.pk not in back], at_once=queued)


@receiver(node_events_recorded.on_commit)
def events_stored(sender: type, node: Node, stored: list[NodeEvent], **kwargs: Any) -> None:
    if stored:
        broadcast.send_events({"type": "events", "node": node.name, "events": [event_data(row) for row in stored]})


@receiver([gpu_drained.on_commit, gpu_returned.on_commit])
def gpu_drained_or_returned(sender: type, gpu: Gpu, **kwargs: Any) -> None:
    broadcast_node_status([gpu.node_id])


# --- alerts ------------------------------------------------------------------------------------


@receiver(alert_changed.on_commit)
def alerts_changed(sender: type, alert_ids: list[int], **kwargs: Any) -> None:
    """Alerts opened or resolved: their new state to the admins following "alerts"."""
    try:
        broadcast.send_alerts({"type": "alerts", "alerts": alerts_data(alert_ids=alert_ids)})
    except Exception:  # a broadcast never fails what caused it
        logger.exception("alerts %s not broadcast", alert_ids)
