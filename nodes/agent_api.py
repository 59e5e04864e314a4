"""The endpoints node agents report to, authenticated by the node's own token.

``Authorization: Bearer gpn_...`` identifies one node; a request is about that node only,
whatever its body says. These endpoints take no user credentials, and user tokens get no
access here (and agent tokens none to the rest of the API).
"""

from __future__ import annotations

import logging
from typing import Any

from django.utils import timezone
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.utils import extend_schema
from rest_framework import authentication, exceptions, permissions
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.throttling import SimpleRateThrottle
from rest_framework.views import APIView

from accounts.services import hash_token
from kernel.api_schema import ERRORS
from nodes.agent_serializers import (
    AgentSnapshotSerializer,
    EventsSerializer,
    HeartbeatResponseSerializer,
    HeartbeatSerializer,
    StoredSerializer,
    TelemetrySerializer,
)
from nodes.leases import node_snapshot
from nodes.models import Node
from nodes.reports import agent_events_record, agent_heartbeat_record, telemetry_record
from nodes.services import AGENT_TOKEN_PREFIX

log = logging.getLogger(__name__)


class NodeAgent:
    """The authenticated "user" of an agent request: a node, never a person."""

    is_authenticated = True
    is_active = True
    is_staff = False
    is_superuser = False
    is_booking_admin = False
    pk = None

    def __init__(self, node: Node) -> None:
        self.node = node

    def get_username(self) -> str:
        return f"agent:{self.node.name}"

    def __str__(self) -> str:
        return self.get_username()


class NodeTokenAuthentication(authentication.BaseAuthentication):
    def authenticate(self, request: Request) -> tuple[NodeAgent, Node] | None:
        header = authentication.get_authorization_header(request).split()
        if not header or header[0].lower() != b"bearer":
            return None
        if len(header) != 2:
            raise exceptions.AuthenticationFailed("Send the header as 'Authorization: Bearer <node token>'.")
        key = header[1].decode(errors="replace")
        if not key.startswith(AGENT_TOKEN_PREFIX):
            raise exceptions.AuthenticationFailed("This endpoint takes a node agent token (gpn_...).")
        node = Node.objects.filter(agent_token_hash=hash_token(key)).first()
        if node is None:
            raise exceptions.AuthenticationFailed("Unknown node token: register the node or issue new credentials.")
        return NodeAgent(node), node

    def authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="agent"'


class NodeTokenScheme(OpenApiAuthenticationExtension):
    target_class = NodeTokenAuthentication
    name = "nodeToken"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {"type": "http", "scheme": "bearer", "description": "A node agent token (gpn_...)."}


class IsNodeAgent(permissions.BasePermission):
    message = "Only a node agent, with its node token, may report here."

    def has_permission(self, request: Request, view: Any) -> bool:
        return isinstance(request.auth, Node)


class AgentRateThrottle(SimpleRateThrottle):
    scope = "agent"

    def get_cache_key(self, request: Request, view: Any) -> str | None:
        return self.cache_format % {"scope": self.scope, "ident": f"node-{request.auth.pk}"}


class AgentView(APIView):
    authentication_classes = [NodeTokenAuthentication]
    permission_classes = [IsNodeAgent]
    throttle_classes = [AgentRateThrottle]

    @property
    def node(self) -> Node:
        return self.request.auth

    def validated(self, serializer_class: type) -> dict[str, Any]:
        serializer = serializer_class(data=self.request.data)
        serializer.is_valid(raise_exception=True)
        return serializer.validated_data


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


class SnapshotView(AgentView):
    @extend_schema(
        summary="This node's signed lease snapshot (node token)",
        description=(
            "The pull, the safety net under the Celery push: an agent whose heartbeat replies have shown a "
            "newer lease_version than it has seen for PULL_AFTER_SECONDS fetches its snapshot here and checks "
            "it exactly as a pushed one. Each call issues a new version, as a push does, so the next heartbeat "
            "reply shows the agent level. Only the calling node's own snapshot."
        ),
        tags=["agent"],
        responses={200: AgentSnapshotSerializer, **ERRORS},
    )
    def get(self, request: Request) -> Response:
        snapshot = node_snapshot(node=self.node, now=timezone.now())
        # A pull means a push did not arrive (lost, held back, an agent just back): worth a line for the admins.
        log.warning("node %s pulled its lease snapshot (version %s)", self.node.name, snapshot["version"])
        # It names people and their schedules: no cache on the way keeps a copy.
        return Response(snapshot, headers={"Cache-Control": "no-store"})
