"""The status cards (reservations/fleet.py) as the API schema describes them; the data are built as dicts."""

from __future__ import annotations

from rest_framework import serializers

from nodes.models import Node
from reservations.fleet import STATES
from reservations.serializers import HolderSerializer


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
    power_limit_w = serializers.FloatField(
        allow_null=True, required=False, help_text="The card's power limit now: lowered by the node's idle power cap."
    )
    ecc_errors_uncorrected = serializers.IntegerField(allow_null=True)
    processes = StatusProcessSerializer(many=True)


class StatusWindowSerializer(serializers.Serializer):
    start = serializers.DateTimeField()
    end = serializers.DateTimeField()
    reason = serializers.CharField()


class StatusSliceSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    profile = serializers.CharField(help_text='The MIG profile, e.g. "3g.40gb".')
    placement = serializers.IntegerField(help_text="Where its GPU instance starts, in the card's memory slices.")
    share = serializers.FloatField(help_text="Its share of the card: compute slices over the card's (3/7 for a 3g).")
    bookable = serializers.BooleanField()
    current = HolderSerializer(allow_null=True)
    next = HolderSerializer(allow_null=True)


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
    slices = StatusSliceSerializer(
        many=True,
        required=False,
        help_text="A card in MIG mode: its slices, with their holders (the card is in use while any is held).",
    )
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
    online = serializers.BooleanField(
        help_text="Its agent reported within the last ~40 seconds (a Slurm node without our agent: Slurm described it)."
    )
    last_seen = serializers.DateTimeField(allow_null=True)
    manager = serializers.ChoiceField(choices=Node.Manager.choices, help_text="Who enforces bookings there.")
    manager_state = serializers.CharField(
        help_text="A Slurm node: its state and reason as Slurm last said them (IDLE+DRAIN: new disk); else empty."
    )
    maintenance = StatusWindowSerializer(allow_null=True)
    agent = StatusAgentSerializer(required=False, allow_null=True, help_text="Admins only.")
    gpus = StatusGpuSerializer(many=True)


class FleetStatusSerializer(serializers.Serializer):
    now = serializers.DateTimeField()
    nodes = StatusNodeSerializer(many=True)
