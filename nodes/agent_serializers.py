"""What an agent may send. Strict types and sizes: the payloads come from machines we do not run."""

from __future__ import annotations

from rest_framework import serializers

from kernel.fields import AwareDateTimeField
from nodes.models import NodeEvent

MAX_GPUS = 256
USER = {"max_length": 32}


class HeartbeatSerializer(serializers.Serializer):
    sent_at = AwareDateTimeField()
    agent_version = serializers.CharField(max_length=40)
    backend = serializers.ChoiceField(choices=["nvml", "simulated"])
    driver_version = serializers.CharField(max_length=40, required=False, allow_null=True, allow_blank=True)
    hostname = serializers.CharField(max_length=253, required=False, allow_blank=True)
    applied_version = serializers.IntegerField(min_value=0, max_value=2**62)
    acls = serializers.DictField(
        child=serializers.ListField(child=serializers.CharField(**USER), max_length=1000),
        required=False,
        help_text="GPU UUID -> users with an ACL on its device file.",
    )
    drained = serializers.ListField(child=serializers.CharField(max_length=80), required=False, max_length=MAX_GPUS)

    def validate_acls(self, value: dict) -> dict:
        if len(value) > MAX_GPUS:
            raise serializers.ValidationError(f"At most {MAX_GPUS} GPUs.")
        return value


class HeartbeatResponseSerializer(serializers.Serializer):
    portal_time = serializers.DateTimeField()
    lease_version = serializers.IntegerField(
        help_text="The newest snapshot version the portal has issued to this node (pushed or pulled). An agent "
        "that has seen less for PULL_AFTER_SECONDS pulls GET /api/v1/agent/snapshot/."
    )
    ignored_gpus = serializers.ListField(child=serializers.CharField(), help_text="UUIDs not of this node.")


class EventSerializer(serializers.Serializer):
    kind = serializers.ChoiceField(choices=NodeEvent.Kind.choices)
    at = AwareDateTimeField()
    gpu = serializers.CharField(max_length=80, required=False)
    user = serializers.CharField(required=False, allow_null=True, allow_blank=True, **USER)
    reservation = serializers.IntegerField(required=False, min_value=1, max_value=2**62)
    message = serializers.CharField(max_length=2000, required=False, allow_blank=True)
    pid = serializers.IntegerField(required=False, min_value=1, max_value=2**31)
    pids = serializers.ListField(
        child=serializers.IntegerField(min_value=1, max_value=2**31), required=False, max_length=1000
    )
    process = serializers.CharField(max_length=64, required=False, allow_null=True, allow_blank=True)
    version = serializers.IntegerField(required=False, min_value=0, max_value=2**62)
    leases = serializers.IntegerField(required=False, min_value=0, max_value=10**6)
    boundary = AwareDateTimeField(required=False)
    drained = serializers.BooleanField(required=False)

    def to_internal_value(self, data: object) -> dict:
        value = super().to_internal_value(data)
        if "boundary" in value:  # kept in the event's JSON details
            value["boundary"] = value["boundary"].isoformat()
        return value


class EventsSerializer(serializers.Serializer):
    events = EventSerializer(many=True, max_length=500)


class ProcessSerializer(serializers.Serializer):
    pid = serializers.IntegerField(min_value=1, max_value=2**31)
    user = serializers.CharField(required=False, allow_null=True, **USER)
    used_memory_mib = serializers.IntegerField(required=False, allow_null=True, min_value=0, max_value=2**31)


class SampleSerializer(serializers.Serializer):
    uuid = serializers.CharField(max_length=80)
    utilization_pct = serializers.IntegerField(allow_null=True, min_value=0, max_value=100)
    memory_used_mib = serializers.IntegerField(allow_null=True, min_value=0, max_value=2**31)
    memory_total_mib = serializers.IntegerField(allow_null=True, min_value=0, max_value=2**31)
    temperature_c = serializers.IntegerField(allow_null=True, min_value=-100, max_value=300)
    slowdown_temperature_c = serializers.IntegerField(allow_null=True, required=False, min_value=-100, max_value=300)
    power_w = serializers.FloatField(allow_null=True, min_value=0, max_value=100_000)
    ecc_errors_uncorrected = serializers.IntegerField(allow_null=True, required=False, min_value=0, max_value=2**62)
    processes = ProcessSerializer(many=True, max_length=4096)
    missing = serializers.ListField(child=serializers.CharField(max_length=40), required=False, max_length=20)


class TelemetrySerializer(serializers.Serializer):
    sent_at = AwareDateTimeField()
    gpus = SampleSerializer(many=True, max_length=MAX_GPUS)


class StoredSerializer(serializers.Serializer):
    stored = serializers.IntegerField()
    ignored_gpus = serializers.ListField(child=serializers.CharField(), help_text="UUIDs not of this node.")


class AgentLeaseSerializer(serializers.Serializer):
    reservation = serializers.IntegerField()
    user = serializers.CharField(help_text="The unix username on the node.")
    gpus = serializers.ListField(child=serializers.CharField(), help_text="GPU (or MIG) UUIDs.")
    start = serializers.DateTimeField()
    end = serializers.DateTimeField()


class AgentSnapshotSerializer(serializers.Serializer):
    """The node's whole desired state, as pushed over Celery (docs/agent.md). Output only."""

    node = serializers.CharField()
    version = serializers.IntegerField(help_text="Higher than any version issued to this node before.")
    issued_at = serializers.DateTimeField(help_text="Agents refuse a snapshot older than MAX_SNAPSHOT_AGE_SECONDS.")
    horizon_end = serializers.DateTimeField(help_text="Leases starting up to this moment are included.")
    leases = AgentLeaseSerializer(many=True)
    signature = serializers.CharField(
        help_text="HMAC-SHA256 with the node's lease secret of the rest as canonical JSON (sorted keys, no "
        "spaces, ASCII): 64 lowercase hex digits (nodes/agent/signing.py)."
    )
