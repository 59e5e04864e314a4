"""Reads of nodes and GPUs."""

from __future__ import annotations

from django.db.models import Count, QuerySet

from nodes.models import Node


def node_list() -> QuerySet[Node]:
    return Node.objects.select_related("agent_state").annotate(gpu_count=Count("gpus")).order_by("name")
