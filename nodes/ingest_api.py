"""The endpoints node agents report to: heartbeats, events and telemetry (stored by nodes/ingest.py)."""

from __future__ import annotations

from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from kernel.api_schema import ERRORS
from nodes.agent_auth import AgentView
from nodes.ingest import agent_events_record, agent_heartbeat_record, telemetry_record
from nodes.ingest_serializers import (
    EventsSerializer,
    HeartbeatResponseSerializer,
    HeartbeatSerializer,
    StoredSerializer,
    TelemetrySerializer,
)
from nodes.models import Node


class HeartbeatView(AgentView):
    @extend_schema(
        summary="Agent heartbeat (node token)",
        tags=["agent"],
        request=HeartbeatSerializer,
        responses={200: HeartbeatResponseSerializer, **ERRORS},
    )
    def post(self, request: Request) -> Response:
        now = timezone.now()
        _, ignored = agent_heartbeat_record(node=self.node, data=self.validated(HeartbeatSerializer), now=now)
        lease_version = Node.objects.values_list("lease_version", flat=True).get(pk=self.node.pk)
        return Response({"portal_time": now, "lease_version": lease_version, "ignored_gpus": ignored})


class EventsView(AgentView):
    @extend_schema(
        summary="Agent events (node token)",
        tags=["agent"],
        request=EventsSerializer,
        responses={200: StoredSerializer, **ERRORS},
    )
    def post(self, request: Request) -> Response:
        stored, ignored = agent_events_record(node=self.node, events=self.validated(EventsSerializer)["events"])
        return Response({"stored": stored, "ignored_gpus": ignored})


class TelemetryView(AgentView):
    @extend_schema(
        summary="Agent telemetry (node token)",
        tags=["agent"],
        request=TelemetrySerializer,
        responses={200: StoredSerializer, **ERRORS},
    )
    def post(self, request: Request) -> Response:
        data = self.validated(TelemetrySerializer)
        stored, ignored = telemetry_record(node=self.node, samples=data["gpus"], now=timezone.now())
        return Response({"stored": stored, "ignored_gpus": ignored})
