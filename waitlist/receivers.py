"""Capacity freed anywhere goes to the waitlist, in the transaction that frees it (waitlist/services.py)."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from django.db.models import Max
from django.db.models.signals import post_delete, post_save, pre_save
from django.dispatch import receiver
from django.utils import timezone

from accounts.signals import user_deactivated
from nodes.models import Gpu, Node
from nodes.signals import gpu_returned
from reservations.models import MaintenanceWindow
from reservations.signals import capacity_freed, reserved_capacity_released
from waitlist.models import Entry
from waitlist.services import entries_close_for_inactive_user, offers_for_freed

log = logging.getLogger(__name__)


@receiver(capacity_freed.in_transaction)
def offer_freed_slot(sender: type, node: Node, gpu_ids: list[int], start: datetime, end: datetime, **kw: Any) -> None:
    """A booking cancelled, rejected or released early (reservations/freed.py): its time to whoever waits."""
    offers_for_freed(node=node, gpu_ids=gpu_ids, start=start, end=end, now=timezone.now())


@receiver(pre_save, sender=MaintenanceWindow)
def remember_maintenance_period(sender: Any, instance: MaintenanceWindow, **kwargs: Any) -> None:
    """A window moved or shortened frees its old period: keep it for post_save."""
    old = MaintenanceWindow.objects.filter(pk=instance.pk).values("start", "end").first() if instance.pk else None
    instance._waitlist_old_period = (old["start"], old["end"]) if old else None  # type: ignore[attr-defined]


@receiver([post_save, post_delete], sender=MaintenanceWindow)
def offer_after_maintenance(sender: Any, instance: MaintenanceWindow, **kwargs: Any) -> None:
    """Maintenance lifted (deleted, moved or shortened): its old period is offered to whoever waits for it."""
    period = (instance.start, instance.end) if kwargs["signal"] is post_delete else None
    period = period or getattr(instance, "_waitlist_old_period", None)
    if period is None:
        return
    units = Gpu.objects.filter(pk=instance.gpu_id) if instance.gpu_id else Gpu.objects.filter(node_id=instance.node_id)
    offers_for_freed(
        node=instance.node,
        gpu_ids=units.values_list("pk", flat=True),
        start=period[0],
        end=period[1],
        now=timezone.now(),
    )


@receiver(reserved_capacity_released.in_transaction)
def offer_released_capacity(
    sender: type, node: Node | None, model: str, gpu_ids: list[int], start: datetime, end: datetime, **kwargs: Any
) -> None:
    """Reserved capacity its group did not book opens to everyone: whoever waits for it is offered it first (on
    its node, or on every node with GPUs of its model)."""
    if gpu_ids and node is not None:
        offers_for_freed(node=node, gpu_ids=gpu_ids, start=start, end=end, now=timezone.now())
        return
    units = Gpu.objects.filter(node=node) if node is not None else Gpu.objects.all()
    if model:
        units = units.filter(model=model)
    by_node: dict[int, list[int]] = {}
    for node_id, gpu_id in units.values_list("node_id", "pk"):
        by_node.setdefault(node_id, []).append(gpu_id)
    for where in Node.objects.filter(pk__in=list(by_node)).order_by("pk"):
        offers_for_freed(node=where, gpu_ids=by_node[where.pk], start=start, end=end, now=timezone.now())


@receiver(gpu_returned.in_transaction)
def offer_returned_gpu(sender: type, gpu: Gpu, **kwargs: Any) -> None:
    """A drained GPU back in service: whoever waits on its node may have it, from now to the last open window."""
    now = timezone.now()
    last = Entry.objects.filter(status=Entry.Status.WAITING, latest_end__gt=now).aggregate(last=Max("latest_end"))
    if last["last"] is not None:
        offers_for_freed(node=gpu.node, gpu_ids=[gpu.pk], start=now, end=last["last"], now=now)


@receiver(user_deactivated)
def close_entries_of_deactivated_user(sender: type, user_id: int, **kwargs: Any) -> None:
    """After the deactivation committed: the account's entries end and its offers pass on. A failure is
    logged; beat's sweep (waitlist.sweep) finishes the job."""
    try:
        entries_close_for_inactive_user(user_id)
    except Exception:
        log.exception("waitlist entries of deactivated user %s not closed yet; beat's sweep will", user_id)
