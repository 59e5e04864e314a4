from __future__ import annotations

from typing import Any

from django.utils import timezone
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from nodes.models import AgentState, Gpu, Node
from nodes.reports import node_online


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
        fields = ("id", "name", "hostname", "description", "status", "requires_approval", "gpu_count", "agent")
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


class HolderSerializer(serializers.Serializer):
    reservation = serializers.IntegerField()
    user = serializers.CharField()
    start = serializers.DateTimeField()
    end = serializers.DateTimeField()


class GpuSerializer(serializers.ModelSerializer):
    node = serializers.CharField(source="node.name", read_only=True)
    current = serializers.SerializerMethodField(help_text="Who holds it now, and until when.")
    next = serializers.SerializerMethodField(help_text="The next booking.")

    class Meta:
        model = Gpu
        fields = ("id", "node", "index", "uuid", "model", "memory_mib", "bookable", "drained_at", "current", "next")
        read_only_fields = fields

    @staticmethod
    def _slot(obj: Gpu, prefix: str) -> dict[str, Any] | None:
        reservation = getattr(obj, f"{prefix}_reservation", None)
        if reservation is None:
            return None
        return {
            "reservation": reservation,
            "user": getattr(obj, f"{prefix}_user"),
            "start": getattr(obj, f"{prefix}_start"),
            "end": getattr(obj, f"{prefix}_end"),
        }

    @extend_schema_field(HolderSerializer(allow_null=True))
    def get_current(self, obj: Gpu) -> dict[str, Any] | None:
        return self._slot(obj, "current")

    @extend_schema_field(HolderSerializer(allow_null=True))
    def get_next(self, obj: Gpu) -> dict[str, Any] | None:
        return self._slot(obj, "next")
