from __future__ import annotations

from rest_framework import serializers


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
