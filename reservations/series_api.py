"""REST API for recurring bookings (reservations/series.py): thin views over the series services.

Only the owner and booking admins see a series; anyone else gets 404, as for reservations.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db.models import QuerySet
from django.urls import reverse
from drf_spectacular.utils import extend_schema, extend_schema_field, extend_schema_view
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from accounts.http import AuthenticatedRequest
from kernel.api_schema import ERRORS
from kernel.fields import AwareDateTimeField
from reservations.api import _pick_gpus, _validated
from reservations.models import Series
from reservations.serializers import gpu_ids_field
from reservations.series import (
    SeriesReport,
    series_book_within_reach,
    series_cancel,
    series_create,
    series_edit,
    series_occurrences,
)

MODES = [(mode.value, mode.label) for mode in Series.Mode]


class SeriesCreateInput(serializers.Serializer):
    gpus = gpu_ids_field("GPU ids, all on one node, booked for every occurrence. Or give node and gpu_count.")
    node = serializers.CharField(required=False, max_length=63, help_text="Node name, with gpu_count.")
    gpu_count = serializers.IntegerField(
        required=False, min_value=1, max_value=64, help_text="With node: GPUs free for the first occurrence."
    )
    start = AwareDateTimeField(help_text="The first occurrence's start; its wall time in `timezone` repeats.")
    end = AwareDateTimeField(help_text="The first occurrence's end.")
    repeat = serializers.CharField(
        max_length=500,
        help_text='An RFC 5545 RRULE with UNTIL or COUNT, e.g. "FREQ=WEEKLY;BYDAY=MO,TU,WE,TH,FR;UNTIL=20270331".',
    )
    timezone = serializers.CharField(
        required=False, max_length=64, help_text="The zone the wall time repeats in (default: your profile's)."
    )
    mode = serializers.ChoiceField(choices=MODES, default=Series.Mode.ALL_OR_NOTHING.value)
    purpose = serializers.CharField(required=False, allow_blank=True, max_length=500, default="")
    preview = serializers.BooleanField(default=False, help_text="Only report what booking would do; write nothing.")

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        by_ids = "gpus" in attrs
        by_count = "node" in attrs or "gpu_count" in attrs
        if by_ids == by_count:
            raise serializers.ValidationError("Give either gpus (GPU ids) or node with gpu_count.")
        if by_count and not ("node" in attrs and "gpu_count" in attrs):
            raise serializers.ValidationError("node and gpu_count go together.")
        return attrs


class SeriesCancelInput(serializers.Serializer):
    scope = serializers.ChoiceField(choices=[("all", "the whole series"), ("following", "from an occurrence on")])
    # "from" is a Python keyword: the field is declared below under its wire name.
    reason = serializers.CharField(required=False, allow_blank=True, max_length=1000, default="")


SeriesCancelInput._declared_fields["from"] = serializers.DateField(
    required=False, help_text="With scope=following: the day of the first occurrence to cancel (YYYY-MM-DD)."
)


class SeriesBookInput(serializers.Serializer):
    mode = serializers.ChoiceField(choices=MODES, default=Series.Mode.SKIP_CONFLICTS.value)
    preview = serializers.BooleanField(default=False)


class SeriesEditInput(serializers.Serializer):
    start_time = serializers.TimeField(required=False, help_text="The new local start time, e.g. 10:00.")
    duration_minutes = serializers.IntegerField(required=False, min_value=1, max_value=7 * 24 * 60)
    gpus = serializers.ListField(
        child=serializers.IntegerField(min_value=1, max_value=2**63 - 1), required=False, allow_empty=False
    )
    mode = serializers.ChoiceField(choices=MODES, default=Series.Mode.ALL_OR_NOTHING.value)
    preview = serializers.BooleanField(default=False)


SeriesEditInput._declared_fields["from"] = serializers.DateField(
    required=False, help_text="The first occurrence (day) to change; default: all that have not started."
)


class OccurrenceReportSerializer(serializers.Serializer):
    day = serializers.DateField()
    start = serializers.DateTimeField()
    end = serializers.DateTimeField()
    outcome = serializers.ChoiceField(choices=["booked", "bookable", "refused", "later", "held_back"])
    code = serializers.CharField(help_text="The refusal's code (slot_conflict, maintenance, limit_exceeded...).")
    message = serializers.CharField(help_text="The refusal a single booking of this occurrence gets.")
    note = serializers.CharField(help_text="How daylight saving time moved this occurrence, if it did.")
    reservation = serializers.IntegerField(allow_null=True)
    status = serializers.CharField(allow_null=True)


class SeriesReportSerializer(serializers.Serializer):
    series = serializers.IntegerField(allow_null=True)
    preview = serializers.BooleanField()
    mode = serializers.CharField()
    summary = serializers.CharField()
    booked = serializers.IntegerField()
    bookable = serializers.IntegerField()
    refused = serializers.IntegerField()
    later = serializers.IntegerField()
    held_back = serializers.IntegerField()
    occurrences = OccurrenceReportSerializer(many=True)


class OccurrenceSerializer(serializers.Serializer):
    day = serializers.DateField()
    start = serializers.DateTimeField()
    end = serializers.DateTimeField()
    state = serializers.CharField(
        help_text="The booking's status (pending, approved, cancelled, rejected), or not_booked, missed, cancelled."
    )
    reservation = serializers.SerializerMethodField()
    note = serializers.CharField()

    @extend_schema_field(serializers.IntegerField(allow_null=True))
    def get_reservation(self, row: dict[str, Any]) -> int | None:
        return row["reservation"].pk if row["reservation"] is not None else None


class SeriesSerializer(serializers.ModelSerializer):
    user = serializers.CharField(source="user.username", read_only=True)
    node = serializers.CharField(source="node.name", read_only=True)
    gpus = serializers.SerializerMethodField()
    timezone = serializers.CharField(source="zone", read_only=True)
    start_time = serializers.TimeField(format="%H:%M", read_only=True)
    duration_minutes = serializers.SerializerMethodField()
    url = serializers.SerializerMethodField(help_text="The series' page in the portal.")

    class Meta:
        model = Series
        fields: tuple[str, ...] = (
            "id",
            "user",
            "node",
            "gpus",
            "rule",
            "timezone",
            "first_day",
            "start_time",
            "duration_minutes",
            "mode",
            "purpose",
            "ends_before",
            "created_at",
            "url",
        )
        read_only_fields = fields

    def get_gpus(self, obj: Series) -> list[int]:
        return sorted(gpu.pk for gpu in obj.gpus.all())

    def get_duration_minutes(self, obj: Series) -> int:
        return int(obj.duration / timedelta(minutes=1))

    @extend_schema_field(serializers.URLField())
    def get_url(self, obj: Series) -> str:
        return self.context["request"].build_absolute_uri(reverse("series-detail", kwargs={"pk": obj.pk}))


class SeriesDetailSerializer(SeriesSerializer):
    occurrences = serializers.SerializerMethodField()

    class Meta(SeriesSerializer.Meta):
        fields = (*SeriesSerializer.Meta.fields, "occurrences")
        read_only_fields = fields

    @extend_schema_field(OccurrenceSerializer(many=True))
    def get_occurrences(self, obj: Series) -> list[dict[str, Any]]:
        return list(OccurrenceSerializer(series_occurrences(obj), many=True).data)


class SeriesResultSerializer(serializers.Serializer):
    series = SeriesSerializer(allow_null=True)
    report = SeriesReportSerializer()


def visible_series(user: Any) -> QuerySet[Series]:
    qs = Series.objects.select_related("user", "node").prefetch_related("gpus")
    return qs if user.is_booking_admin else qs.filter(user=user)


@extend_schema_view(
    list=extend_schema(summary="Your recurring bookings (admins: all)", responses={200: SeriesSerializer(many=True)}),
    retrieve=extend_schema(
        summary="One series with its occurrences and their state", responses={200: SeriesDetailSerializer, **ERRORS}
    ),
)
class SeriesViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    queryset = Series.objects.none()  # for the schema; get_queryset() decides what is visible
    lookup_value_regex = r"[0-9]{1,18}"
    request: AuthenticatedRequest

    def get_queryset(self) -> QuerySet[Series]:
        return visible_series(self.request.user)

    def get_serializer_class(self) -> type[serializers.BaseSerializer]:
        return SeriesDetailSerializer if self.action == "retrieve" else SeriesSerializer

    @extend_schema(
        summary="Book a recurring series (or preview it)",
        description="Every occurrence is checked as a booking of its own, in one transaction. `mode` all: every "
        "occurrence within reach is booked, or none is (409 `series_conflict`, with the per-occurrence report "
        "in `details`); skip: the refused ones are skipped. Occurrences beyond how far ahead you may book are "
        "`later`: book them with `book-within-reach` (beat does it daily). `preview: true` answers 200 with the "
        "report and writes nothing.",
        request=SeriesCreateInput,
        responses={201: SeriesResultSerializer, 200: SeriesResultSerializer, **ERRORS},
    )
    def create(self, request: AuthenticatedRequest) -> Response:
        data = _validated(SeriesCreateInput, request)
        gpus: list[Any] = (
            data["gpus"]
            if "gpus" in data
            else _pick_gpus(data["node"], data["gpu_count"], data["start"], data["end"], user=request.user)
        )
        report = series_create(
            user=request.user,
            gpus=gpus,
            start=data["start"],
            end=data["end"],
            rule=data["repeat"],
            zone=data.get("timezone") or request.user.zone.key,
            mode=data["mode"],
            purpose=data["purpose"],
            preview=data["preview"],
        )
        return self._result(report, status.HTTP_200_OK if report.preview else status.HTTP_201_CREATED)

    @extend_schema(
        summary="Cancel the whole series, or one occurrence and those after it",
        request=SeriesCancelInput,
        responses={200: SeriesDetailSerializer, **ERRORS},
    )
    @action(detail=True, methods=["post"])
    def cancel(self, request: AuthenticatedRequest, pk: str | None = None) -> Response:
        data = _validated(SeriesCancelInput, request)
        series = self.get_object()
        series_cancel(
            series=series, actor=request.user, scope=data["scope"], from_day=data.get("from"), reason=data["reason"]
        )
        return Response(SeriesDetailSerializer(self.get_object(), context=self.get_serializer_context()).data)

    @extend_schema(
        summary="Book the occurrences now within reach",
        description="Occurrences with no booking yet that can be booked now (they came within how far ahead you "
        "may book, or their slot freed up). Occurrences cancelled or rejected one by one stay so.",
        request=SeriesBookInput,
        responses={200: SeriesResultSerializer, **ERRORS},
    )
    @action(detail=True, methods=["post"], url_path="book-within-reach")
    def book_within_reach(self, request: AuthenticatedRequest, pk: str | None = None) -> Response:
        data = _validated(SeriesBookInput, request)
        report = series_book_within_reach(
            series=self.get_object(), actor=request.user, mode=data["mode"], preview=data["preview"]
        )
        return self._result(report, status.HTTP_200_OK)

    @extend_schema(
        summary="Change the time of day, duration or GPUs from an occurrence on",
        description="The occurrences' bookings from `from` on that have not started are cancelled and booked "
        "again as changed, in one transaction and with `mode`'s rules (all or nothing changes nothing when one "
        "is refused).",
        request=SeriesEditInput,
        responses={200: SeriesResultSerializer, **ERRORS},
    )
    @action(detail=True, methods=["post"])
    def edit(self, request: AuthenticatedRequest, pk: str | None = None) -> Response:
        data = _validated(SeriesEditInput, request)
        minutes = data.get("duration_minutes")
        report = series_edit(
            series=self.get_object(),
            actor=request.user,
            from_day=data.get("from"),
            start_time=data.get("start_time"),
            duration=timedelta(minutes=minutes) if minutes else None,
            gpus=data.get("gpus"),
            mode=data["mode"],
            preview=data["preview"],
        )
        return self._result(report, status.HTTP_200_OK)

    def _result(self, report: SeriesReport, code: int) -> Response:
        series = visible_series(self.request.user).filter(pk=report.series.pk).first() if report.series else None
        body = {
            "series": SeriesSerializer(series, context=self.get_serializer_context()).data if series else None,
            "report": report.as_dict(),
        }
        return Response(body, status=code)
