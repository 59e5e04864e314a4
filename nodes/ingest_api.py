"""The endpoints node agents report to: heartbeats, events and telemetry (stored by nodes/ingest.py)."""

from __future__ import annotations

from django.conf import settings
from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from kernel.api import DomainError
from kernel.api_schema import ERRORS, error_response
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
from nodes.telemetry_queue import QueueAway, QueueFull, telemetry_enqueue


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


class TelemetryBacklog(DomainError):
    code = "telemetry_backlog"
    http_status = 503
    retry_after = "5"  # an agent's reporting interval


class TelemetryView(AgentView):
    @extend_schema(
        summary="Agent telemetry (node token)",
        tags=["agent"],
        request=TelemetrySerializer,
        responses={
            200: StoredSerializer,
            **ERRORS,
            503: error_response("The portal is behind on storing telemetry: the report was not kept (Retry-After)."),
        },
    )
    def post(self, request: Request) -> Response:
        samples, now = self.validated(TelemetrySerializer)["gpus"], timezone.now()
        if settings.TELEMETRY_INGEST == "inline":
            stored, ignored = telemetry_record(node=self.node, samples=samples, now=now)
            return Response({"stored": stored, "ignored_gpus": ignored})
        # Queued (nodes/telemetry_queue.py): the GPUs that are not this node's are named back now and
        # left out; the consumer looks again when it stores the rest.
        known = self.gpu_uuids
        ignored = sorted({sample["uuid"] for sample in samples} - known)
        samples = [sample for sample in samples if sample["uuid"] in known]
        try:
            telemetry_enqueue(node=self.node, samples=samples, now=now)
        except QueueAway:  # no queue without Redis: stored here, as with TELEMETRY_INGEST=inline
            stored, _ = telemetry_record(node=self.node, samples=samples, now=now)
            return Response({"stored": stored, "ignored_gpus": ignored})
        except QueueFull:
            raise TelemetryBacklog(
                "The portal is behind on storing telemetry: this report was not kept. Send the next one as usual."
            ) from None
        return Response({"stored": len(samples), "ignored_gpus": ignored})
