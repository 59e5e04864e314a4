"""Input serializers check shape only (the services check the rules); output serializers are
reused wherever a reservation is shown."""

from __future__ import annotations

from typing import Any

from django.urls import reverse
from django.utils import timezone
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from kernel.fields import AwareDateTimeField
from nodes.models import Gpu
from reservations.models import Reservation
from reservations.selectors import pending_extension


def gpu_ids_field(help_text: str) -> serializers.ListField:
    """Optional GPU ids (1 to 64 of them), as every input that names GPUs takes them."""
    return serializers.ListField(
        child=serializers.IntegerField(min_value=1, max_value=2**63 - 1),
        required=False,
        allow_empty=False,
        max_length=64,
        help_text=help_text,
    )


class ReservationCreateInput(serializers.Serializer):
    gpus = gpu_ids_field("GPU ids, all on one node. Or give node and gpu_count and let the portal pick.")
    node = serializers.CharField(required=False, max_length=63, help_text="Node name, with gpu_count.")
    gpu_count = serializers.IntegerField(required=False, min_value=1, max_value=64)
    profile = serializers.RegexField(
        r"\A[0-9a-z.+]{1,40}\Z",
        required=False,
        help_text='With node and gpu_count: that many MIG slices of this profile (e.g. "3g.40gb") instead of cards.',
    )
    start = AwareDateTimeField()
    end = AwareDateTimeField()
    purpose = serializers.CharField(required=False, allow_blank=True, max_length=500, default="")

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        by_ids = "gpus" in attrs
        by_count = "node" in attrs or "gpu_count" in attrs
        if by_ids == by_count:
            raise serializers.ValidationError("Give either gpus (GPU ids) or node with gpu_count.")
        if by_count and not ("node" in attrs and "gpu_count" in attrs):
            raise serializers.ValidationError("node and gpu_count go together.")
        if "profile" in attrs and not by_count:
            raise serializers.ValidationError({"profile": "profile goes with node and gpu_count, not with gpus."})
        return attrs


class ExtendInput(serializers.Serializer):
    end = AwareDateTimeField()


class ReasonInput(serializers.Serializer):
    reason = serializers.CharField(required=False, allow_blank=True, max_length=1000, default="")


class RequiredReasonInput(serializers.Serializer):
    reason = serializers.CharField(max_length=1000)


class AllocatedGpuSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    index = serializers.IntegerField()
    uuid = serializers.CharField()
    model = serializers.CharField()


class PendingExtensionSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    end = serializers.DateTimeField(help_text="The end asked for; the booking keeps its own end until approved.")


class ReservationSerializer(serializers.ModelSerializer):
    """A reservation. For someone else's booking (researchers' view) the private fields are null."""

    user = serializers.CharField(source="user.username", read_only=True)
    node = serializers.CharField(source="node.name", read_only=True)
    gpus = serializers.SerializerMethodField()
    phase = serializers.SerializerMethodField()
    is_own = serializers.SerializerMethodField()
    decided_by = serializers.CharField(source="decided_by.username", default=None, read_only=True, allow_null=True)
    # Null when the reservation is someone else's (a researcher sees only the busy slot).
    purpose = serializers.CharField(read_only=True, allow_null=True)
    decision_reason = serializers.CharField(read_only=True, allow_null=True)
    cancel_reason = serializers.CharField(read_only=True, allow_null=True)
    extends = serializers.IntegerField(
        source="extends_id",
        read_only=True,
        allow_null=True,
        help_text="Set on a pending extension: the booking it extends (merged into it when approved).",
    )
    pending_extension = serializers.SerializerMethodField(
        help_text="An extension of this booking waiting for an admin's approval, or null."
    )
    series = serializers.IntegerField(
        source="series_id", read_only=True, allow_null=True, help_text="The recurring series it belongs to, or null."
    )
    url = serializers.SerializerMethodField(
        help_text="The booking's page in the portal (absolute URL); null when it is someone else's."
    )

    PRIVATE = ("purpose", "decided_by", "decided_at", "decision_reason", "cancel_reason", "pending_extension", "url")

    class Meta:
        model = Reservation
        fields = (
            "id",
            "user",
            "node",
            "gpus",
            "start",
            "end",
            "status",
            "phase",
            "is_own",
            "purpose",
            "created_at",
            "decided_by",
            "decided_at",
            "decision_reason",
            "cancelled_at",
            "cancel_reason",
            "released_at",
            "extends",
            "pending_extension",
            "series",
            "url",
        )
        read_only_fields = fields

    @extend_schema_field(AllocatedGpuSerializer(many=True))
    def get_gpus(self, obj: Reservation) -> list[dict[str, Any]]:
        gpus = sorted((a.gpu for a in obj.allocations.all()), key=lambda gpu: gpu.index)
        return [{"id": g.pk, "index": g.index, "uuid": g.uuid, "model": g.model} for g in gpus]

    @extend_schema_field(PendingExtensionSerializer(allow_null=True))
    def get_pending_extension(self, obj: Reservation) -> dict[str, Any] | None:
        waiting = pending_extension(obj)
        return None if waiting is None else {"id": waiting.pk, "end": waiting.end}

    @extend_schema_field(serializers.URLField(allow_null=True))
    def get_url(self, obj: Reservation) -> str:
        return self.context["request"].build_absolute_uri(reverse("reservation-detail", kwargs={"pk": obj.pk}))

    def get_phase(self, obj: Reservation) -> str:
        return obj.phase(self.context.get("now") or timezone.now())

    def get_is_own(self, obj: Reservation) -> bool:
        return self._sees_all(obj)

    def _sees_all(self, obj: Reservation) -> bool:
        user = self.context["request"].user
        return obj.user_id == user.pk or user.is_booking_admin

    def to_representation(self, instance: Reservation) -> dict[str, Any]:
        data = super().to_representation(instance)
        data["is_own"] = instance.user_id == self.context["request"].user.pk
        if not self._sees_all(instance):
            for name in self.PRIVATE:
                data[name] = None
        return data


class AvailabilityQuery(serializers.Serializer):
    gpus = serializers.IntegerField(min_value=1, max_value=64, help_text="How many GPUs (or slices, with profile).")
    profile = serializers.RegexField(
        r"\A[0-9a-z.+]{1,40}\Z",
        required=False,
        help_text='MIG slices of this profile (e.g. "3g.40gb") instead of cards.',
    )
    hours = serializers.FloatField(min_value=0.25, max_value=24 * 60)
    node = serializers.CharField(required=False, max_length=63)
    min_memory_gb = serializers.IntegerField(required=False, min_value=0, max_value=100_000)
    after = AwareDateTimeField(required=False)


class WindowSerializer(serializers.Serializer):
    node = serializers.CharField(source="node.name")
    gpus = serializers.SerializerMethodField()
    gpu_indexes = serializers.SerializerMethodField()
    start = serializers.DateTimeField()
    end = serializers.DateTimeField()

    def get_gpus(self, window: Any) -> list[int]:
        return [gpu.pk for gpu in window.gpus]

    def get_gpu_indexes(self, window: Any) -> list[int]:
        return [gpu.index for gpu in window.gpus]


class AvailabilitySerializer(serializers.Serializer):
    results = WindowSerializer(many=True)


# --- GPUs with their holder and next booking (GET /api/v1/gpus/) ------------------------------


class HolderSerializer(serializers.Serializer):
    reservation = serializers.IntegerField()
    user = serializers.CharField()
    start = serializers.DateTimeField()
    end = serializers.DateTimeField()


class GpuSerializer(serializers.ModelSerializer):
    node = serializers.CharField(source="node.name", read_only=True)
    current = serializers.SerializerMethodField(help_text="Who holds it now, and until when.")
    next = serializers.SerializerMethodField(help_text="The next booking.")
    profile = serializers.CharField(read_only=True, help_text='A MIG slice\'s profile, e.g. "3g.40gb"; "" for a card.')
    mig_mode = serializers.BooleanField(
        read_only=True, help_text="A card in MIG mode is booked as its slices (booking the card books them all)."
    )

    class Meta:
        model = Gpu
        fields = (
            "id",
            "node",
            "index",
            "uuid",
            "model",
            "memory_mib",
            "bookable",
            "drained_at",
            "parent",
            "profile",
            "mig_mode",
            "current",
            "next",
        )
        read_only_fields = fields
        # Declared here, not as a field attribute: "parent" is also every serializer field's own attribute.
        extra_kwargs = {"parent": {"help_text": "For a MIG slice, the id of its card; null for a card."}}

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
