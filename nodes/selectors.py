"""Reads of nodes and GPUs."""

from __future__ import annotations

from datetime import datetime

from django.db.models import Count, OuterRef, QuerySet, Subquery

from nodes.models import Gpu, Node
from reservations.models import Allocation


def node_list() -> QuerySet[Node]:
    return Node.objects.select_related("agent_state").annotate(gpu_count=Count("gpus")).order_by("name")


def gpu_list(
    *, now: datetime, node: str | None = None, model: str | None = None, min_memory_mib: int | None = None
) -> QuerySet[Gpu]:
    """GPUs with their current holder and next booking, in one query whatever the data size
    (each annotation is an index-backed subquery on the active allocations)."""
    qs = Gpu.objects.select_related("node")
    if node:
        qs = qs.filter(node__name=node)
    if model:
        qs = qs.filter(model__icontains=model)
    if min_memory_mib is not None:
        qs = qs.filter(memory_mib__gte=min_memory_mib)

    live = Allocation.objects.filter(gpu=OuterRef("pk"), active=True)
    current = live.filter(start__lte=now, end__gt=now).order_by("start")
    upcoming = live.filter(start__gt=now).order_by("start")
    annotations = {}
    for prefix, source in (("current", current), ("next", upcoming)):
        annotations |= {
            f"{prefix}_reservation": Subquery(source.values("reservation_id")[:1]),
            f"{prefix}_user": Subquery(source.values("reservation__user__username")[:1]),
            f"{prefix}_start": Subquery(source.values("start")[:1]),
            f"{prefix}_end": Subquery(source.values("end")[:1]),
        }
    return qs.annotate(**annotations).order_by("node__name", "index")
