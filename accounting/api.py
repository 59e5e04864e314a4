"""The usage report over the API: the same figures as the reports page (accounting/report.py)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django.conf import settings
from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from accounting.length_advice import length_advice
from accounting.report import DIMENSIONS, demand_by_hour_of_week, peak_hours, usage_report
from accounts.http import AuthenticatedRequest
from kernel.api_schema import READ_ERRORS
from kernel.fields import AwareDateTimeField

DEFAULT_DAYS = 30


class PeriodParams(serializers.Serializer):
    start = AwareDateTimeField(required=False, help_text="Default: 30 days before the end.")
    end = AwareDateTimeField(required=False, help_text="Default: now.")

    def validate(self, data: dict[str, Any]) -> dict[str, Any]:
        end = data.get("end") or timezone.now()
        start = data.get("start") or end - timedelta(days=DEFAULT_DAYS)
        if start >= end:
            raise serializers.ValidationError({"end": "The end must come after the start."})
        if end - start > timedelta(days=settings.REPORT_MAX_DAYS):
            raise serializers.ValidationError(
                {"start": f"A report covers at most {settings.REPORT_MAX_DAYS} days: ask for a shorter period."}
            )
        return {**data, "start": start, "end": end}


class UsageParams(PeriodParams):
    by = serializers.ChoiceField(choices=DIMENSIONS, default="user", help_text="What each row is.")


class DemandParams(PeriodParams):
    zone = serializers.CharField(required=False, max_length=64, help_text="IANA zone; default: yours.")

    def validate_zone(self, value: str) -> str:
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError):
            message = f"Unknown time zone '{value[:64]}': use a name like Europe/Berlin."
            raise serializers.ValidationError(message) from None
        return value


class UsageRowSerializer(serializers.Serializer):
    key = serializers.IntegerField(allow_null=True, help_text="The person's, group's, node's or GPU's id.")
    label = serializers.CharField()  # type: ignore[assignment]  # a field named "label"; the stubs see Field.label
    bookings = serializers.IntegerField()
    booked_gpu_hours = serializers.FloatField()
    used_gpu_hours = serializers.FloatField(help_text="Booked minutes whose mean utilisation reached the threshold.")
    unmeasured_gpu_hours = serializers.FloatField(
        help_text="Booked minutes reported without a utilisation reading (MIG slices on cards without GPM)."
    )
    efficiency = serializers.FloatField(
        allow_null=True, help_text="used / (booked - unmeasured); null when no booked time could be judged."
    )
    released_early = serializers.IntegerField()
    no_shows = serializers.IntegerField(
        help_text="Bookings that ended with utilisation readings but not one used minute."
    )
    no_show_gpu_hours = serializers.FloatField()
    energy_kwh = serializers.FloatField(
        allow_null=True, help_text="Energy the booked GPUs used (their cards' counters); null without readings."
    )
    idle_energy_kwh = serializers.FloatField(
        allow_null=True, help_text="Of that, the energy of measured minutes under the used threshold."
    )
    energy_estimated = serializers.BooleanField(
        help_text="Part of the energy is estimated: a counter reset, readings far apart, or a card without a counter."
    )
    cost = serializers.FloatField(
        allow_null=True, help_text="The energy priced with the tariffs (in currency); null where none priced it."
    )
    co2_kg = serializers.FloatField(allow_null=True, help_text="kg of CO₂e of the energy, with the tariffs.")
    idle_node_hours = serializers.FloatField(
        allow_null=True, help_text="By node, for booking admins: hours no booking held any of its GPUs."
    )


class UsageReportSerializer(serializers.Serializer):
    start = serializers.DateTimeField()
    end = serializers.DateTimeField()
    by = serializers.ChoiceField(choices=DIMENSIONS)
    used_threshold_pct = serializers.IntegerField()
    rows = UsageRowSerializer(many=True)
    has_unmeasured = serializers.BooleanField(help_text="Whether any row has unmeasured GPU-hours.")
    has_energy = serializers.BooleanField(help_text="Whether any row has energy figures.")
    has_cost = serializers.BooleanField(help_text="Whether any row has a cost (tariffs with prices are set).")
    has_co2 = serializers.BooleanField(help_text="Whether any row has a CO₂ figure.")
    currency = serializers.CharField(help_text="The currency of the costs (TARIFF_CURRENCY).")
    idle_node_hours = serializers.FloatField(
        allow_null=True, help_text="Booking admins: the fleet's hours with no booking on any GPU of a node."
    )
    node_hours = serializers.FloatField(allow_null=True, help_text="Booking admins: the fleet's node-hours.")
    total = UsageRowSerializer(allow_null=True, help_text="Null when rows may overlap (by group).")


class DemandSerializer(serializers.Serializer):
    start = serializers.DateTimeField()
    end = serializers.DateTimeField()
    zone = serializers.CharField()
    hours = serializers.ListField(
        child=serializers.ListField(child=serializers.FloatField()),
        help_text="Booked GPU-hours per [weekday][hour], Monday first.",
    )
    peak = serializers.ListField(
        child=serializers.ListField(child=serializers.IntegerField()),
        help_text="[weekday, hour] of the busiest quarter of the week's hours.",
    )


def report_payload(*, start: datetime, end: datetime, by: str, viewer: Any) -> dict[str, Any]:
    report = usage_report(start=start, end=end, by=by, viewer=viewer)
    return {
        "start": start,
        "end": end,
        "by": by,
        "used_threshold_pct": settings.USAGE_USED_THRESHOLD_PCT,
        "rows": [row.as_dict() for row in report.rows],
        "has_unmeasured": report.has_unmeasured,
        "has_energy": report.has_energy,
        "has_cost": report.has_cost,
        "has_co2": report.has_co2,
        "currency": settings.TARIFF_CURRENCY,
        "idle_node_hours": None if report.idle_node_hours is None else round(report.idle_node_hours, 2),
        "node_hours": None if report.node_hours is None else round(report.node_hours, 2),
        "total": None if by == "group" else report.total.as_dict(),
    }


def demand_payload(*, start: datetime, end: datetime, zone: str, viewer: Any) -> dict[str, Any]:
    hours = demand_by_hour_of_week(start=start, end=end, viewer=viewer, zone=zone)
    return {"start": start, "end": end, "zone": zone, "hours": hours, "peak": sorted(map(list, peak_hours(hours)))}


def _params(serializer_class: type, request: Request) -> dict[str, Any]:
    params = serializer_class(data=request.query_params)
    params.is_valid(raise_exception=True)
    return params.validated_data


class UsageReportView(APIView):
    """Admins see everyone's usage; researchers their own."""

    @extend_schema(
        summary="Usage report: booked and used GPU-hours, efficiency, early releases, no-shows",
        parameters=[
            OpenApiParameter("start", datetime),
            OpenApiParameter("end", datetime),
            OpenApiParameter("by", str, enum=list(DIMENSIONS)),
        ],
        responses={200: UsageReportSerializer, **READ_ERRORS},
    )
    def get(self, request: Request) -> Response:
        data = _params(UsageParams, request)
        return Response(report_payload(start=data["start"], end=data["end"], by=data["by"], viewer=request.user))


class DemandView(APIView):
    @extend_schema(
        summary="Demand: booked GPU-hours by hour of the week",
        parameters=[
            OpenApiParameter("start", datetime),
            OpenApiParameter("end", datetime),
            OpenApiParameter("zone", str),
        ],
        responses={200: DemandSerializer, **READ_ERRORS},
    )
    def get(self, request: AuthenticatedRequest) -> Response:
        data = _params(DemandParams, request)
        zone = data.get("zone") or request.user.zone.key
        return Response(demand_payload(start=data["start"], end=data["end"], zone=zone, viewer=request.user))


class LengthAdviceParams(serializers.Serializer):
    gpus = serializers.IntegerField(min_value=1, max_value=1024, help_text="How many GPUs the slot has.")
    hours = serializers.FloatField(
        required=False, min_value=0.01, max_value=24 * 366, help_text="The slot's length asked for, if any."
    )


class LengthAdviceSerializer(serializers.Serializer):
    gpus = serializers.IntegerField()
    bookings = serializers.IntegerField(help_text="Past bookings the figures come from (ended, measured).")
    mean_busy_hours = serializers.FloatField(allow_null=True, help_text="How long each GPU was busy, on average.")
    mean_booked_hours = serializers.FloatField(allow_null=True)
    suggested_hours = serializers.FloatField(
        allow_null=True, help_text="The mean busy time on the booking grid; null with fewer than three bookings."
    )
    advice = serializers.CharField(
        allow_null=True, help_text="Words when the hours asked for are far longer than the history suggests."
    )


class LengthAdviceView(APIView):
    """Advice only: a slot's length from the caller's own last bookings of as many GPUs."""

    @extend_schema(
        summary="How long your last bookings of N GPUs were busy, and a length to book",
        parameters=[LengthAdviceParams],
        responses={200: LengthAdviceSerializer, **READ_ERRORS},
    )
    def get(self, request: AuthenticatedRequest) -> Response:
        data = _params(LengthAdviceParams, request)
        advice = length_advice(user=request.user, gpus=data["gpus"], now=timezone.now())
        return Response(
            {
                "gpus": advice.gpus,
                "bookings": advice.bookings,
                "mean_busy_hours": _rounded(advice.mean_busy_hours),
                "mean_booked_hours": _rounded(advice.mean_booked_hours),
                "suggested_hours": advice.suggested_hours,
                "advice": advice.about(data.get("hours")),
            }
        )


def _rounded(hours: float | None) -> float | None:
    return None if hours is None else round(hours, 2)
