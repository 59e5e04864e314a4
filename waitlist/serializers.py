"""What the waitlist API takes and gives."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from kernel.fields import AwareDateTimeField
from reservations.serializers import gpu_ids_field
from waitlist.models import Entry


class JoinInput(serializers.Serializer):
    gpus = gpu_ids_field("Wait for these GPU ids (all on one node). Or give node (or model) and count.")
    node = serializers.CharField(required=False, max_length=63, help_text="Any `count` GPUs of this node.")
    model = serializers.CharField(required=False, max_length=100, help_text="Any `count` GPUs of this model.")
    count = serializers.IntegerField(required=False, min_value=1, max_value=64, default=1)
    profile = serializers.RegexField(
        r"\A[0-9a-z.+]{1,40}\Z", required=False, default="", help_text='MIG slices of this profile ("3g.40gb").'
    )
    earliest_start = AwareDateTimeField()
    latest_end = AwareDateTimeField()
    duration_minutes = serializers.IntegerField(min_value=1, max_value=60 * 24 * 366)
    purpose = serializers.CharField(required=False, allow_blank=True, max_length=500, default="")
    auto_book = serializers.BooleanField(
        required=False, default=True, help_text="Book an offered slot at once (default), or wait for a claim."
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        kinds = [name for name in ("gpus", "node", "model") if name in attrs]
        if len(kinds) != 1:
            raise serializers.ValidationError("Give exactly one of gpus (GPU ids), node (with count) or model.")
        if attrs.get("profile") and "node" not in attrs:
            raise serializers.ValidationError({"profile": "profile goes with node and count."})
        return attrs


class OfferSerializer(serializers.Serializer):
    reservation = serializers.IntegerField(help_text="The reservation that holds the slot (status offered).")
    start = serializers.DateTimeField()
    end = serializers.DateTimeField()
    gpus = serializers.ListField(child=serializers.IntegerField(), help_text="GPU ids.")


class EntrySerializer(serializers.ModelSerializer):
    user = serializers.CharField(source="user.get_username", read_only=True)
    node = serializers.CharField(source="node.name", read_only=True, allow_null=True)
    gpus: serializers.PrimaryKeyRelatedField[Any] = serializers.PrimaryKeyRelatedField(many=True, read_only=True)
    want = serializers.CharField(source="want_text", read_only=True)
    duration_minutes = serializers.SerializerMethodField()
    offer = serializers.SerializerMethodField(help_text="The slot on offer while the status is offered.")
    position = serializers.IntegerField(
        read_only=True, allow_null=True, help_text="Rank among the entries waiting on the same node (1 is next)."
    )

    class Meta:
        model = Entry
        fields = [
            "id",
            "user",
            "status",
            "want",
            "node",
            "gpus",
            "gpu_model",
            "profile",
            "count",
            "earliest_start",
            "latest_end",
            "duration_minutes",
            "purpose",
            "auto_book",
            "created_at",
            "ended_at",
            "reservation",
            "offer",
            "claim_by",
            "skip_reason",
            "position",
        ]

    def get_duration_minutes(self, entry: Entry) -> int:
        return int(entry.duration.total_seconds() // 60)

    @extend_schema_field(OfferSerializer(allow_null=True))
    def get_offer(self, entry: Entry) -> dict[str, Any] | None:
        offer = entry.reservation if entry.status == Entry.Status.OFFERED else None
        if offer is None:
            return None
        return {
            "reservation": offer.pk,
            "start": offer.start.isoformat(),
            "end": offer.end.isoformat(),
            "gpus": sorted(offer.allocations.values_list("gpu_id", flat=True)),
        }
