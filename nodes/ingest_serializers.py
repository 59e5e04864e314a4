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


# Watts beyond any card's power draw or limit (a GB200 superchip's module: ~2,700 W).
MAX_POWER_W = 100_000
# Placements and slice counts beyond any card's (8 memory slices, 7 compute slices on today's MIG cards).
MAX_CARD_SLICES = 64
# The largest value the database columns these land in (PositiveIntegerField) hold, on PostgreSQL as on SQLite:
# a larger one would pass validation and fail the insert.
INTEGER_MAX = 2**31 - 1


class MigSliceSerializer(serializers.Serializer):
    uuid = serializers.RegexField(r"\AMIG-[0-9a-fA-F-]{8,64}\Z", max_length=80)
    profile = serializers.RegexField(r"\A[0-9a-z.+]{1,40}\Z", help_text="As nvidia-smi names it: 3g.40gb.")
    gpu_instance_id = serializers.IntegerField(min_value=0, max_value=1000)
    compute_instance_id = serializers.IntegerField(min_value=0, max_value=1000)
    placement_start = serializers.IntegerField(min_value=0, max_value=MAX_CARD_SLICES - 1)
    placement_size = serializers.IntegerField(min_value=1, max_value=MAX_CARD_SLICES)
    compute_slices = serializers.IntegerField(min_value=1, max_value=MAX_CARD_SLICES)
    memory_mib = serializers.IntegerField(min_value=0, max_value=INTEGER_MAX, allow_null=True)


class MigCardSerializer(serializers.Serializer):
    uuid = serializers.RegexField(r"\AGPU-[0-9a-fA-F-]{8,64}\Z", max_length=80)
    mode_current = serializers.BooleanField()
    mode_pending = serializers.BooleanField()
    placement_slots = serializers.IntegerField(min_value=1, max_value=MAX_CARD_SLICES)
    compute_slices = serializers.IntegerField(min_value=1, max_value=MAX_CARD_SLICES)
    slices = MigSliceSerializer(many=True, max_length=MAX_CARD_SLICES)  # type: ignore[call-arg]

    def validate(self, data: dict) -> dict:
        """A layout a card can have: slices inside its placement range, none overlapping another's GPU
        instance, each at most the card's compute slices. Anything else is refused whole."""
        taken: dict[tuple[int, int], int] = {}
        for piece in data["slices"]:
            low, high = piece["placement_start"], piece["placement_start"] + piece["placement_size"]
            if high > data["placement_slots"] or piece["compute_slices"] > data["compute_slices"]:
                raise serializers.ValidationError(f"Slice {piece['uuid']} does not fit its card.")
            for (other_low, other_high), gpu_instance in taken.items():
                if low < other_high and other_low < high and gpu_instance != piece["gpu_instance_id"]:
                    raise serializers.ValidationError(f"Slice {piece['uuid']} overlaps another GPU instance.")
            taken[(low, high)] = piece["gpu_instance_id"]
        if len({piece["uuid"] for piece in data["slices"]}) != len(data["slices"]):
            raise serializers.ValidationError("A slice UUID appears twice.")
        return data


class LaunchStatusSerializer(serializers.Serializer):
    """One environment the agent runs or ran (protocol.LaunchStatus)."""

    reservation = serializers.IntegerField(min_value=1, max_value=2**62)
    number = serializers.IntegerField(min_value=1, max_value=10**6)
    state = serializers.ChoiceField(choices=list(protocol.LAUNCH_STATES))
    exit_code = serializers.IntegerField(required=False, allow_null=True, min_value=-255, max_value=255)
    message = serializers.CharField(
        required=False, allow_blank=True, max_length=protocol.TEXT_LIMITS["message"], trim_whitespace=False
    )
    port = serializers.IntegerField(required=False, allow_null=True, min_value=1, max_value=65535)
    token = serializers.CharField(required=False, allow_blank=True, max_length=128)
    tail = serializers.CharField(
        required=False, allow_blank=True, max_length=protocol.LAUNCH_TAIL_CHARS, trim_whitespace=False
    )
    # Printed in the ssh command its holder pastes into a shell: a plain absolute path, nothing a shell would read.
    socket = serializers.RegexField(
        protocol.SOCKET_PATH_RE, required=False, allow_blank=True, max_length=protocol.MAX_SOCKET_PATH_CHARS
    )


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
        help_text="GPU or MIG slice UUID -> users with an ACL on every file it needs (a slice: its card's device "
        "file and its capability files).",
    )
    drained = serializers.ListField(child=serializers.CharField(max_length=80), required=False, max_length=MAX_GPUS)
    mig = MigCardSerializer(  # type: ignore[call-arg]
        many=True, required=False, max_length=MAX_GPUS, help_text="The MIG-capable cards: mode and slices."
    )
    launches = LaunchStatusSerializer(  # type: ignore[call-arg]
        many=True,
        required=False,
        max_length=protocol.MAX_LAUNCH_STATUSES,
        help_text="The environments the agent runs or ran lately (issue 22), each with its state and output's tail.",
    )

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
    launch = serializers.IntegerField(required=False, min_value=1, max_value=10**6, help_text="launch_* events.")
    exit_code = serializers.IntegerField(required=False, min_value=-255, max_value=255)
    power_limit_w = serializers.FloatField(
        required=False, min_value=0, max_value=MAX_POWER_W, help_text="The limit a power event set or tried (W)."
    )

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
    memory_used_mib = serializers.IntegerField(allow_null=True, min_value=0, max_value=INTEGER_MAX)
    memory_total_mib = serializers.IntegerField(allow_null=True, min_value=0, max_value=INTEGER_MAX)
    temperature_c = serializers.IntegerField(allow_null=True, min_value=-100, max_value=300)
    slowdown_temperature_c = serializers.IntegerField(allow_null=True, required=False, min_value=-100, max_value=300)
    power_w = serializers.FloatField(allow_null=True, min_value=0, max_value=MAX_POWER_W)
    ecc_errors_uncorrected = serializers.IntegerField(allow_null=True, required=False, min_value=0, max_value=2**62)
    processes = ProcessSerializer(many=True, max_length=4096)  # type: ignore[call-arg]
    missing = serializers.ListField(child=serializers.CharField(max_length=40), required=False, max_length=20)
    # Agents before energy reporting send neither (gpubook_agent/gpus/energy.py).
    energy_mj = serializers.IntegerField(
        allow_null=True,
        required=False,
        min_value=0,
        max_value=2**62,
        help_text="The card's energy counter in mJ: grows until a driver reload (or, estimated, an agent restart).",
    )
    energy_estimated = serializers.BooleanField(
        required=False, default=False, help_text="The counter is the card's power readings added up (no counter)."
    )
    # Agents before the idle power cap send none (gpubook_agent/power.py).
    power_limit_w = serializers.FloatField(
        allow_null=True,
        required=False,
        min_value=0,
        max_value=MAX_POWER_W,
        help_text="The card's power limit now (W); lowered while the node's idle power cap holds the card.",
    )


class TelemetrySerializer(serializers.Serializer):
    sent_at = AwareDateTimeField()
    gpus = SampleSerializer(many=True, max_length=MAX_GPUS)  # type: ignore[call-arg]


class StoredSerializer(serializers.Serializer):
    stored = serializers.IntegerField()
    ignored_gpus = serializers.ListField(child=serializers.CharField(), help_text="UUIDs not of this node.")
