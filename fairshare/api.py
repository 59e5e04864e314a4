"""The ``fair_share`` of ``GET /api/v1/me/`` (registered in FairshareConfig.ready: accounts/me_parts.py)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from rest_framework import serializers

from fairshare.factors import FairShare, fairshare_for


class GroupPartSerializer(serializers.Serializer):
    name = serializers.CharField()
    shares = serializers.IntegerField(help_text="The group's shares.")
    total_shares = serializers.IntegerField(help_text="The shares of every group with an active member.")
    members = serializers.IntegerField(help_text="The group's active members, who split its share.")


class FairShareSerializer(serializers.Serializer):
    factor = serializers.FloatField(help_text="2^(-usage/share): 1 with no recent usage, 0.5 at one's share.")
    usage = serializers.FloatField(help_text="Your decayed usage over everyone's (0..1).")
    share = serializers.FloatField(help_text="Your share of the GPUs (0..1; everyone's add up to 1).")
    booked_gpu_hours = serializers.FloatField(source="booked_hours", help_text="Decayed GPU-hours booked.")
    used_gpu_hours = serializers.FloatField(source="used_hours", help_text="Decayed GPU-hours used.")
    used_weight = serializers.FloatField(help_text="What a used GPU-hour adds on top of its booked hour.")
    half_life_days = serializers.FloatField(help_text="An hour of usage counts half after this many days.")
    groups = GroupPartSerializer(many=True)
    explanation = serializers.CharField(help_text="Why the factor is what it is, in words.")


def my_fair_share(*, user: Any, now: datetime) -> FairShare:
    """The person's own factor; MeSerializer's ``fair_share`` field (a FairShareSerializer) shows it."""
    return fairshare_for([user.pk], now=now)[user.pk]
