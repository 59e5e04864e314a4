"""GET /api/v1/availability/suggest/: free slots near an asked one, ranked by demand and energy price
(accounting/suggestions.py). The booking dialog and ``gpubook`` ask it when a slot is refused or busy."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from accounting.suggestions import RANKING, Outlook, suggest
from accounts.http import AuthenticatedRequest
from kernel.api_schema import READ_ERRORS
from kernel.fields import LATEST, AwareDateTimeField
from nodes.models import memory_gb_to_mib
from reservations.serializers import AvailabilityQuery, WindowSerializer
from reservations.timegrid import floor_to_grid


class SuggestQuery(AvailabilityQuery):
    after = None  # type: ignore[assignment]  # the asked start takes its place
    start = AwareDateTimeField(help_text="The start asked for; the slot is `hours` long.")

    def validate_start(self, start: Any) -> Any:
        if floor_to_grid(start) < floor_to_grid(timezone.now()):
            raise serializers.ValidationError("That start is in the past: ask for a slot from now on.")
        return start

    def validate(self, data: dict[str, Any]) -> dict[str, Any]:
        if data["start"] + timedelta(hours=data["hours"]) >= LATEST:
            last = f"{LATEST:%Y-%m-%d}"
            raise serializers.ValidationError(
                {"hours": f"A slot that long from that start would end after the last date the portal keeps ({last})."}
            )
        return data


class OutlookSerializer(serializers.Serializer):
    start = serializers.DateTimeField()
    end = serializers.DateTimeField()
    contention_pct = serializers.FloatField(help_text="The mean share of the fleet's GPUs booked at these hours.")
    busiest_pct = serializers.FloatField(help_text="The share booked in the slot's busiest hour of the week.")
    busy = serializers.BooleanField(help_text="Whether the slot touches the busiest quarter of the week's hours.")
    price_per_kwh = serializers.DecimalField(max_digits=12, decimal_places=4, allow_null=True)
    why = serializers.CharField(help_text="The figures the slot was ranked on, in words.")


class SuggestionSerializer(OutlookSerializer):
    node = serializers.CharField()
    gpus = serializers.ListField(child=serializers.IntegerField())
    gpu_indexes = serializers.ListField(child=serializers.IntegerField())


class AskedSerializer(OutlookSerializer):
    free = serializers.BooleanField(help_text="Whether a node has room for the slot now.")


class SuggestResponseSerializer(serializers.Serializer):
    asked = AskedSerializer()
    offer = serializers.BooleanField(help_text="True when the asked slot has no room or is busy.")
    suggestions = SuggestionSerializer(many=True)
    ranking = serializers.CharField()
    history_weeks = serializers.IntegerField()
    fleet_gpus = serializers.IntegerField()
    currency = serializers.CharField()


def _outlook(outlook: Outlook) -> dict[str, Any]:
    return {
        "start": outlook.start,
        "end": outlook.end,
        "contention_pct": outlook.contention_pct,
        "busiest_pct": outlook.busiest_pct,
        "busy": outlook.busy,
        "price_per_kwh": outlook.price_per_kwh,
        "why": outlook.why(settings.TARIFF_CURRENCY),
    }


class SuggestView(APIView):
    """Advice only: what is free near a slot, and how contended and how dear those hours usually are."""

    @extend_schema(
        summary="Free slots of the same size near an asked one, ranked by past demand and energy price",
        parameters=[SuggestQuery],
        responses={200: SuggestResponseSerializer, **READ_ERRORS},
    )
    def get(self, request: AuthenticatedRequest) -> Response:
        query = SuggestQuery(data=request.query_params)
        query.is_valid(raise_exception=True)
        data = query.validated_data
        found = suggest(
            user=request.user,
            gpu_count=data["gpus"],
            duration=timedelta(hours=data["hours"]),
            start=data["start"],
            now=timezone.now(),
            zone=request.user.zone.key,
            node_name=data.get("node"),
            min_memory_mib=memory_gb_to_mib(data.get("min_memory_gb")),
            profile=data.get("profile", ""),
        )
        suggestions = [{**_outlook(item.outlook), **WindowSerializer(item.window).data} for item in found.suggestions]
        body = {
            "asked": {**_outlook(found.asked), "free": found.asked_free},
            "offer": found.offer,
            "suggestions": suggestions,
            "ranking": RANKING,
            "history_weeks": found.weeks,
            "fleet_gpus": found.cards,
            "currency": settings.TARIFF_CURRENCY,
        }
        return Response(SuggestResponseSerializer(body).data)
