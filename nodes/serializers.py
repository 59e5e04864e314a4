"""The API's nodes: what a node is and whether its agent reports."""

from __future__ import annotations

from typing import Any

from django.utils import timezone
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from nodes.liveness import node_online
from nodes.models import AgentState, Node


class AgentSummarySerializer(serializers.Serializer):
    online = serializers.BooleanField(help_text="Reported within the last ~40 seconds.")
    last_seen = serializers.DateTimeField()
    version = serializers.CharField()
    applied_lease_version = serializers.IntegerField()


class NodeSerializer(serializers.ModelSerializer):
    gpu_count = serializers.IntegerField(read_only=True)
    agent = serializers.SerializerMethodField(help_text="The node agent's last report; null if it never reported.")

    class Meta:
        model = Node
        fields = (
            "id", "name", "hostname", "description", "status", "requires_approval", "gpu_count", "agent",
            "manager", "books_whole", "manager_state",
        )  # fmt: skip
        read_only_fields = fields

    @extend_schema_field(AgentSummarySerializer(allow_null=True))
    def get_agent(self, obj: Node) -> dict[str, Any] | None:
        try:
            state = obj.agent_state
        except AgentState.DoesNotExist:
            return None
        return {
            "online": node_online(state, timezone.now()),
            "last_seen": state.last_seen,
            "version": state.agent_version,
            "applied_lease_version": state.applied_version,
        }
