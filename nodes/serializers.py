from __future__ import annotations

from typing import Any

from django.utils import timezone
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from nodes.models import AgentState, Gpu, Node
from nodes.status import STATES, node_online


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


# --- the status cards (nodes.status); these describe the API schema, the data are built as dicts ---


class StatusProcessSerializer(serializers.Serializer):
    pid = serializers.IntegerField(required=False, help_text="Admins only.")
    user = serializers.CharField(help_text="The process owner's account on the node.")
    used_memory_mib = serializers.IntegerField(allow_null=True)


class StatusTelemetrySerializer(serializers.Serializer):
    at = serializers.DateTimeField()
    utilization_pct = serializers.IntegerField(allow_null=True)
    memory_used_mib = serializers.IntegerField(allow_null=True)
    memory_total_mib = serializers.IntegerField(allow_null=True)
    temperature_c = serializers.IntegerField(allow_null=True)
    slowdown_temperature_c = serializers.IntegerField(allow_null=True)
    power_w = serializers.FloatField(allow_null=True)
    ecc_errors_uncorrected = serializers.IntegerField(allow_null=True)
    processes = StatusProcessSerializer(many=True)


class StatusWindowSerializer(serializers.Serializer):
    start = serializers.DateTimeField()
    end = serializers.DateTimeField()
    reason = serializers.CharField()


class StatusGpuSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    index = serializers.IntegerField()
    uuid = serializers.CharField()
    model = serializers.CharField()
    memory_mib = serializers.IntegerField()
    state = serializers.ChoiceField(
        choices=STATES,
        help_text="What matters most now: offline > drained > maintenance > not bookable > in use > free.",
    )
    bookable = serializers.BooleanField()
    drained = serializers.BooleanField()
    drain_reason = serializers.CharField(required=False, help_text="Admins only.")
    maintenance = StatusWindowSerializer(allow_null=True)
    current = HolderSerializer(allow_null=True)
    next = HolderSerializer(allow_null=True)
    telemetry = StatusTelemetrySerializer(allow_null=True, help_text="The latest reading; null before the first.")
    history = serializers.ListField(
        child=serializers.ListField(child=serializers.IntegerField(), min_length=2, max_length=2),
        required=False,
        help_text="The last minutes of utilisation, oldest first: [milliseconds since the epoch, percent]. "
        "In snapshots only; live updates carry the newest reading.",
    )


class StatusAgentSerializer(serializers.Serializer):
    version = serializers.CharField()
    backend = serializers.CharField()
    driver_version = serializers.CharField()
    applied_lease_version = serializers.IntegerField()
    clock_skew_seconds = serializers.FloatField(allow_null=True)


class StatusNodeSerializer(serializers.Serializer):
    name = serializers.CharField()
    hostname = serializers.CharField()
    status = serializers.ChoiceField(choices=Node.Status.choices)
    online = serializers.BooleanField(help_text="Its agent reported within the last ~40 seconds.")
    last_seen = serializers.DateTimeField(allow_null=True)
    maintenance = StatusWindowSerializer(allow_null=True)
    agent = StatusAgentSerializer(required=False, allow_null=True, help_text="Admins only.")
    gpus = StatusGpuSerializer(many=True)


class FleetStatusSerializer(serializers.Serializer):
    now = serializers.DateTimeField()
    nodes = StatusNodeSerializer(many=True)
