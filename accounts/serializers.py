from __future__ import annotations

from rest_framework import serializers

from accounts.me_parts import me_parts
from kernel.fields import AwareDateTimeField


class LimitUsageSerializer(serializers.Serializer):
    allowed = serializers.FloatField(allow_null=True, help_text="Null: no limit.")
    used = serializers.FloatField(allow_null=True)


class MeSerializer(serializers.Serializer):
    username = serializers.CharField()
    unix_username = serializers.CharField(allow_null=True)
    email = serializers.CharField()
    is_admin = serializers.BooleanField()
    requires_approval = serializers.BooleanField()
    gpus_at_once = LimitUsageSerializer(help_text="GPUs held now.")
    weekly_gpu_hours = LimitUsageSerializer(help_text="GPU-hours in the busiest 7 days around now.")
    max_slot_hours = serializers.FloatField(allow_null=True)
    max_days_ahead = serializers.IntegerField(allow_null=True)

    def get_fields(self) -> dict[str, serializers.Field]:
        """Plus the fields apps above accounts add (accounts/me_parts.py)."""
        return super().get_fields() | me_parts.fields()


class ApiTokenSerializer(serializers.Serializer):
    id = serializers.IntegerField(read_only=True)
    name = serializers.CharField(max_length=100)
    prefix = serializers.CharField(read_only=True, help_text="The token's first characters, to tell tokens apart.")
    created_at = serializers.DateTimeField(read_only=True)
    expires_at = AwareDateTimeField(required=False, allow_null=True)
    last_used_at = serializers.DateTimeField(read_only=True, allow_null=True)
    revoked_at = serializers.DateTimeField(read_only=True, allow_null=True)


class NewApiTokenSerializer(ApiTokenSerializer):
    token = serializers.CharField(read_only=True, help_text="The token itself. Shown this once; only a hash is kept.")
