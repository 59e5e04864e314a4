"""Read-only REST API for nodes and GPUs."""

from __future__ import annotations

from django.db.models import QuerySet
from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import serializers, viewsets
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from kernel.api_schema import READ_ERRORS
from nodes import selectors
from nodes.models import Gpu, Node, memory_gb_to_mib
from nodes.serializers import FleetStatusSerializer, GpuSerializer, NodeSerializer
from nodes.status import fleet_status, for_viewer


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


class GpuFilters(serializers.Serializer):
    node = serializers.CharField(required=False, max_length=63)
    model = serializers.CharField(required=False, max_length=100)
    min_memory_gb = serializers.IntegerField(required=False, min_value=0, max_value=100_000)


@extend_schema_view(
    list=extend_schema(
        summary="GPUs with their current holder and next booking",
        parameters=[
            OpenApiParameter("node", str, description="Node name."),
            OpenApiParameter("model", str, description="Part of the model name, e.g. A100."),
            OpenApiParameter("min_memory_gb", int, description="At least this much memory."),
        ],
        responses={200: GpuSerializer(many=True), **READ_ERRORS},
    ),
    retrieve=extend_schema(summary="One GPU", responses={200: GpuSerializer, **READ_ERRORS}),
)
class GpuViewSet(viewsets.ReadOnlyModelViewSet):
    serializer_class = GpuSerializer
    lookup_value_regex = r"[0-9]{1,18}"

    def get_queryset(self) -> QuerySet[Gpu]:
        filters = GpuFilters(data=self.request.query_params)
        filters.is_valid(raise_exception=True)
        data = filters.validated_data
        return selectors.gpu_list(
            now=timezone.now(),
            node=data.get("node"),
            model=data.get("model"),
            min_memory_mib=memory_gb_to_mib(data.get("min_memory_gb")),
        )


class FleetStatusView(APIView):
    """The status page's data: the websocket topic "status" sends the same, then keeps it fresh."""

    @extend_schema(
        summary="Every GPU's live status: telemetry, holder, next booking, offline/drained/maintenance",
        responses={200: FleetStatusSerializer, **READ_ERRORS},
    )
    def get(self, request: Request) -> Response:
        now = timezone.now()
        nodes = fleet_status(now=now, history=True)
        return Response({"now": now, "nodes": for_viewer(nodes, admin=request.user.is_booking_admin)})
