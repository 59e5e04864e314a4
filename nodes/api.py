"""Read-only REST API for nodes (their GPUs, with holders, are in reservations/api.py)."""

from __future__ import annotations

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import viewsets

from kernel.api_schema import READ_ERRORS
from nodes import selectors
from nodes.models import Node
from nodes.serializers import NodeSerializer


@extend_schema_view(
    list=extend_schema(summary="Nodes", responses={200: NodeSerializer(many=True), **READ_ERRORS}),
    retrieve=extend_schema(summary="One node", responses={200: NodeSerializer, **READ_ERRORS}),
)
class NodeViewSet(viewsets.ReadOnlyModelViewSet):
    serializer_class = NodeSerializer
    lookup_field = "name"
    lookup_value_regex = r"[a-z0-9][a-z0-9-]{0,62}"

    def get_queryset(self) -> QuerySet[Node]:
        return selectors.node_list()
