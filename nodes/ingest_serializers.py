"""What an agent may send (nodes/ingest_api.py). Strict types and sizes: the payloads come from machines
we do not run."""

from __future__ import annotations

from rest_framework import serializers

from gpubook_agent import protocol
from kernel.fields import AwareDateTimeField
from nodes.models import NodeEvent

# The limits and shapes are the wire protocol's (gpubook_agent/protocol.py): the agent keeps within them.
MAX_GPUS = protocol.MAX_GPUS
USER_MAX_LENGTH = protocol.TEXT_LIMITS["user"]
# `SomeSerializer(many=True, max_length=n)` is how DRF bounds a list of objects, but djangorestframework-stubs
# do not know max_length there: those lines carry a `type: ignore[call-arg]`.


class HeartbeatSerializer(serializers.Serializer):
    sent_at = AwareDateTimeField()
    agent_version = serializers.CharField(max_length=40)
    backend = serializers.ChoiceField(choices=list(protocol.BACKENDS))
    driver_version = serializers.CharField(max_length=40, required=False, allow_null=True, allow_blank=True)
    hostname = serializers.CharField(max_length=253, required=False, allow_blank=True)
    applied_version = serializers.IntegerField(min_value=0, max_value=2**62)
    acls = serializers.DictField(
        child=serializers.ListField(child=serializers.CharField(max_length=USER_MAX_LENGTH), max_length=1000),
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
    user = serializers.CharField(required=False, allow_null=True, allow_blank=True, max_length=USER_MAX_LENGTH)
    reservation = serializers.IntegerField(required=False, min_value=1, max_value=2**62)
    message = serializers.CharField(max_length=protocol.TEXT_LIMITS["message"], required=False, allow_blank=True)
    pid = serializers.IntegerField(required=False, min_value=1, max_value=2**31)
    pids = serializers.ListField(
        child=serializers.IntegerField(min_value=1, max_value=2**31), required=False, max_length=protocol.MAX_PIDS
    )
    process = serializers.CharField(
        max_length=protocol.TEXT_LIMITS["process"], required=False, allow_null=True, allow_blank=True
    )
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
    events = EventSerializer(many=True, max_length=protocol.EVENTS_PER_POST)  # type: ignore[call-arg]


class ProcessSerializer(serializers.Serializer):
    pid = serializers.IntegerField(min_value=1, max_value=2**31)
    user = serializers.CharField(required=False, allow_null=True, max_length=USER_MAX_LENGTH)
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
    processes = ProcessSerializer(many=True, max_length=4096)  # type: ignore[call-arg]
    missing = serializers.ListField(child=serializers.CharField(max_length=40), required=False, max_length=20)


class TelemetrySerializer(serializers.Serializer):
    sent_at = AwareDateTimeField()
    gpus = SampleSerializer(many=True, max_length=MAX_GPUS)  # type: ignore[call-arg]


class StoredSerializer(serializers.Serializer):
    stored = serializers.IntegerField()
    ignored_gpus = serializers.ListField(child=serializers.CharField(), help_text="UUIDs not of this node.")
