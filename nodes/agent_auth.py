"""How the endpoints for node agents authenticate: by the node's own token (nodes/ingest_api.py for what
agents report, reservations/lease_api.py for the snapshot they pull).

``Authorization: Bearer gpn_...`` identifies one node; a request is about that node only,
whatever its body says. These endpoints take no user credentials, and user tokens get no
access here (and agent tokens none to the rest of the API).
"""

from __future__ import annotations

from typing import Any, cast

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions, permissions
from rest_framework.request import Request
from rest_framework.throttling import SimpleRateThrottle
from rest_framework.views import APIView

from accounts.services import hash_token
from nodes.models import Node
from nodes.services import AGENT_TOKEN_PREFIX


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
        return cast(Node, self.request.auth)  # IsNodeAgent lets in only a node's token, whose auth is its Node

    def validated(self, serializer_class: type) -> dict[str, Any]:
        serializer = serializer_class(data=self.request.data)
        serializer.is_valid(raise_exception=True)
        return serializer.validated_data
