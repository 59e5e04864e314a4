"""The pull: a node agent fetches its own signed lease snapshot (reservations/leases.py) over HTTPS."""

from __future__ import annotations

import logging

from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from gpubook_agent import protocol
from kernel.api_schema import ERRORS
from nodes.agent_auth import AgentView
from reservations.leases import node_snapshot

log = logging.getLogger(__name__)


class AgentLaunchSerializer(serializers.Serializer):
    """An environment the lease asks the node to run while it lasts (issue 22; docs/agent.md)."""

    number = serializers.IntegerField(help_text="1, 2, ... within the reservation: the launch is gpubook-<id>-<n>.")
    kind = serializers.ChoiceField(choices=list(protocol.LAUNCH_KINDS))
    image = serializers.CharField(help_text='A container\'s image; "" for a plain command.')
    argv = serializers.ListField(
        child=serializers.CharField(),
        help_text="The command, an argument list; {socket}, {port} and {token} filled in there.",
    )
    memory_max_bytes = serializers.IntegerField(allow_null=True)
    max_processes = serializers.IntegerField(allow_null=True)


class AgentLeaseSerializer(serializers.Serializer):
    reservation = serializers.IntegerField()
    user = serializers.CharField(help_text="The unix username on the node.")
    gpus = serializers.ListField(child=serializers.CharField(), help_text="GPU (or MIG) UUIDs.")
    start = serializers.DateTimeField()
    end = serializers.DateTimeField()
    launches = AgentLaunchSerializer(many=True, required=False, help_text="Left out when the lease launches nothing.")


class AgentSnapshotSerializer(serializers.Serializer):
    """The node's whole desired state, as pushed over Celery (docs/agent.md). Output only."""

    node = serializers.CharField()
    version = serializers.IntegerField(help_text="Higher than any version issued to this node before.")
    issued_at = serializers.DateTimeField(help_text="Agents refuse a snapshot older than MAX_SNAPSHOT_AGE_SECONDS.")
    horizon_end = serializers.DateTimeField(help_text="Leases starting up to this moment are included.")
    leases = AgentLeaseSerializer(many=True)
    idle_power_limit_pct = serializers.IntegerField(
        allow_null=True,
        required=False,
        help_text="The idle power cap: cards no lease holds are limited to this percent of their default power "
        "limit (null: off; docs/agent.md, 'Power limits').",
    )
    signature = serializers.CharField(
        help_text="HMAC-SHA256 with the node's lease secret of the rest as canonical JSON (sorted keys, no "
        "spaces, ASCII): 64 lowercase hex digits (gpubook_agent/signing.py)."
    )


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
