"""Admin edits that change what open pages show: maintenance windows, nodes and GPUs.

Bookings announce themselves from the booking service (reservations.services._changed), which
knows the period a change touched; these models are edited in Django admin, so their saves and
deletes are caught here, in one place.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver

from live import broadcast
from nodes.models import Gpu, Node
from nodes.status import broadcast_node_status
from reservations.models import MaintenanceWindow


def _calendar_after_commit(*, node: str | None, start: Any = None, end: Any = None) -> None:
    start_text, end_text = (start.isoformat() if start else None), (end.isoformat() if end else None)
    transaction.on_commit(lambda: broadcast.send_calendar_change(node=node, start=start_text, end=end_text))


@receiver([post_save, post_delete], sender=MaintenanceWindow)
def maintenance_changed(sender: Any, instance: MaintenanceWindow, **kwargs: Any) -> None:
    node = Node.objects.filter(pk=instance.node_id).values_list("name", flat=True).first()
    _calendar_after_commit(node=node, start=instance.start, end=instance.end)
    broadcast_node_status([instance.node_id])


@receiver([post_save, post_delete], sender=Node)
def node_changed(sender: Any, instance: Node, **kwargs: Any) -> None:
    # Rows appear, vanish or change their names: every calendar reloads.
    _calendar_after_commit(node=None)
    broadcast_node_status(None if kwargs["signal"] is post_delete else [instance.pk])


@receiver([post_save, post_delete], sender=Gpu)
def gpu_changed(sender: Any, instance: Gpu, **kwargs: Any) -> None:
    _calendar_after_commit(node=None)
    broadcast_node_status([instance.node_id])
