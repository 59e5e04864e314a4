"""How the endpoints for node agents authenticate: by the node's own token (nodes/ingest_api.py for what
agents report, reservations/lease_api.py for the snapshot they pull).

``Authorization: Bearer gpn_...`` identifies one node; a request is about that node only,
whatever its body says. These endpoints take no user credentials, and user tokens get no
access here (and agent tokens none to the rest of the API).
"""

from __future__ import annotations

import threading
from typing import Any, cast

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions, permissions, serializers
from rest_framework.request import Request
from rest_framework.settings import api_settings
from rest_framework.throttling import SimpleRateThrottle
from rest_framework.views import APIView

from accounts.services import hash_token
from nodes.models import Node
from nodes.services import AGENT_TOKEN_PREFIX


class NodeAgent:
    """The authenticated "user" of an agent request: a node, never a person; with the UUIDs of the node's
    GPUs (and MIG slices) as the portal knows them when the request came."""

    is_authenticated = True
    is_active = True
    is_staff = False
    is_superuser = False
    is_booking_admin = False
    pk = None

    def __init__(self, node: Node, gpu_uuids: frozenset[str]) -> None:
        self.node = node
        self.gpu_uuids = gpu_uuids

    def get_username(self) -> str:
        return f"agent:{self.node.name}"

    def __str__(self) -> str:
        return self.get_username()


# The node and its GPUs' UUIDs in one read: a row per GPU (one, with a NULL UUID, for a node without any).
# Every agent request makes it, and a node's telemetry is checked against those UUIDs; through the ORM, the two
# queries cost about four times the CPU (0.8 ms against 0.2 on the development machine; issue 20).
_NODE_AND_GPUS_SQL = (
    "SELECT nodes_node.*, nodes_gpu.uuid AS gpu_uuid FROM nodes_node"
    " LEFT JOIN nodes_gpu ON nodes_gpu.node_id = nodes_node.id WHERE nodes_node.agent_token_hash = %s"
)


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
        rows: list[Any] = list(Node.objects.raw(_NODE_AND_GPUS_SQL, [hash_token(key)]))
        if not rows:
            raise exceptions.AuthenticationFailed("Unknown node token: register the node or issue new credentials.")
        return NodeAgent(rows[0], frozenset(row.gpu_uuid for row in rows if row.gpu_uuid is not None)), rows[0]

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

    @property
    def gpu_uuids(self) -> frozenset[str]:
        """The UUIDs of the node's GPUs and MIG slices, read with the node."""
        return cast(NodeAgent, self.request.user).gpu_uuids

    def validated(self, serializer_class: type[serializers.Serializer]) -> dict[str, Any]:
        """The request's body, validated by ``serializer_class`` (DRF's ValidationError, a 400, if not)."""
        data = self.request.data
        if data is None:  # a JSON null: the message is_valid() gives rather than "This field may not be null."
            raise serializers.ValidationError({api_settings.NON_FIELD_ERRORS_KEY: ["No data provided"]}, code="null")
        return _validator(serializer_class).run_validation(data)


_validators: dict[type[serializers.Serializer], serializers.Serializer] = {}
_validators_lock = threading.Lock()


def _validator(serializer_class: type[serializers.Serializer]) -> serializers.Serializer:
    """One instance of ``serializer_class`` for the process, validating every request's body.

    A serializer builds its fields, and those of the serializers nested in it, by deep-copying its declared
    ones when it is first used: a third of the CPU of validating a report of 8 GPUs (0.22 of 0.64 ms). Validation
    keeps no state on the instance (a list's child serializer validates every item in turn, as here every
    body, and the requests' threads at once), and ``run_validation`` raises the ValidationError
    ``is_valid(raise_exception=True)`` would. Per process, not per thread: Django's ASGI handler gives each
    request a thread of its own. The fields are built here, under the lock, so no request builds them.
    """
    with _validators_lock:
        if serializer_class not in _validators:
            _validators[serializer_class] = _with_fields_built(serializer_class())
        return _validators[serializer_class]


def _with_fields_built(serializer: serializers.Serializer) -> serializers.Serializer:
    for field in serializer.fields.values():
        nested = field.child if isinstance(field, serializers.ListSerializer) else field
        if isinstance(nested, serializers.Serializer):
            _with_fields_built(nested)
    return serializer
