"""REST API for reservations: thin views over the services."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db.models import QuerySet
from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.http import AuthenticatedRequest
from kernel.api_schema import ERRORS, READ_ERRORS
from kernel.fields import AwareDateTimeField
from nodes.models import Gpu, Node, memory_gb_to_mib
from reservations import selectors, services
from reservations.availability import earliest_windows
from reservations.exceptions import InvalidBooking, SlotConflict
from reservations.limits import booking_horizon, effective_limits
from reservations.models import Reservation
from reservations.serializers import (
    AvailabilityQuery,
    AvailabilitySerializer,
    ExtendInput,
    GpuSerializer,
    ReasonInput,
    RequiredReasonInput,
    ReservationCreateInput,
    ReservationSerializer,
)
from reservations.timegrid import ceil_to_grid, floor_to_grid

ACTIONS = ("cancel", "release", "extend", "approve", "reject")


@extend_schema_view(
    list=extend_schema(
        summary="Reservations you can see",
        parameters=[
            OpenApiParameter("mine", bool, description="Only your own reservations."),
            OpenApiParameter("node", str, description="Node name."),
            OpenApiParameter("status", str, enum=Reservation.Status.values),
            OpenApiParameter("after", datetime, description="Only those ending after this ISO 8601 time."),
            OpenApiParameter("before", datetime, description="Only those starting before this ISO 8601 time."),
        ],
        responses={200: ReservationSerializer(many=True), **ERRORS},
    ),
    retrieve=extend_schema(summary="One reservation", responses={200: ReservationSerializer, **ERRORS}),
)
class ReservationViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    serializer_class = ReservationSerializer
    queryset = Reservation.objects.none()  # for the schema; get_queryset() decides what is visible
    lookup_value_regex = r"[0-9]{1,18}"  # fits a 64-bit id, so no overflow reaches the database
    request: AuthenticatedRequest  # the API's default permission, IsAuthenticated, lets no one else in

    def get_queryset(self) -> QuerySet[Reservation]:
        user = self.request.user
        if self.action in ACTIONS:
            return selectors.reservations_actionable(user=user)
        qs = selectors.reservation_list(user=user)
        if self.action != "list":
            return qs
        return self._filtered(qs)

    def _filtered(self, qs: QuerySet[Reservation]) -> QuerySet[Reservation]:
        params = self.request.query_params
        if params.get("mine", "").lower() in {"1", "true", "yes"}:
            qs = qs.filter(user=self.request.user)
        if params.get("node"):
            qs = qs.filter(node__name=params["node"])
        if params.get("status"):
            if params["status"] not in Reservation.Status.values:
                raise InvalidBooking(
                    f"Unknown status {params['status']!r}: use one of {', '.join(Reservation.Status.values)}.",
                    field="status",
                )
            qs = qs.filter(status=params["status"])
        for name, lookup in (("after", "end__gt"), ("before", "start__lt")):
            if params.get(name):
                qs = qs.filter(**{lookup: _parse_time(name, params[name])})
        return qs

    @extend_schema(
        summary="Book GPUs",
        request=ReservationCreateInput,
        responses={201: ReservationSerializer, **ERRORS},
    )
    def create(self, request: AuthenticatedRequest) -> Response:
        data = _validated(ReservationCreateInput, request)
        if "gpus" in data:
            gpus: list[Any] = data["gpus"]
        else:
            gpus = _pick_gpus(
                data["node"], data["gpu_count"], data["start"], data["end"], data.get("profile", ""), user=request.user
            )
        reservation = services.reservation_create(
            user=request.user, gpus=gpus, start=data["start"], end=data["end"], purpose=data["purpose"]
        )
        made = selectors.booking_as_made(reservation)
        return Response(self.get_serializer(made).data, status=status.HTTP_201_CREATED)

    @extend_schema(
        summary="Cancel (before the start; admins any time)",
        request=ReasonInput,
        responses={200: ReservationSerializer, **ERRORS},
    )
    @action(detail=True, methods=["post"])
    def cancel(self, request: AuthenticatedRequest, pk: str | None = None) -> Response:
        data = _validated(ReasonInput, request)
        return self._respond(
            services.reservation_cancel(reservation=self.get_object(), actor=request.user, reason=data["reason"])
        )

    @extend_schema(summary="End a running slot now", request=None, responses={200: ReservationSerializer, **ERRORS})
    @action(detail=True, methods=["post"])
    def release(self, request: AuthenticatedRequest, pk: str | None = None) -> Response:
        return self._respond(services.reservation_release(reservation=self.get_object(), actor=request.user))

    @extend_schema(
        summary="Move the end later",
        description="Where a new booking would wait for approval, so does the added time: the booking keeps "
        "its end, and `pending_extension` names the request (a reservation that `extends` it), which holds the "
        "time until an admin approves (merging it into this booking) or rejects it. A booking still waiting for "
        "approval, or an extension request, is never lengthened (409 `invalid_state`): the admin approves what "
        "they saw.",
        request=ExtendInput,
        responses={200: ReservationSerializer, **ERRORS},
    )
    @action(detail=True, methods=["post"])
    def extend(self, request: AuthenticatedRequest, pk: str | None = None) -> Response:
        data = _validated(ExtendInput, request)
        return self._respond(
            services.reservation_extend(reservation=self.get_object(), actor=request.user, end=data["end"])
        )

    @extend_schema(
        summary="Approve (admins)",
        description="Approving a pending extension merges it into the booking it extends, which is returned.",
        request=ReasonInput,
        responses={200: ReservationSerializer, **ERRORS},
    )
    @action(detail=True, methods=["post"])
    def approve(self, request: AuthenticatedRequest, pk: str | None = None) -> Response:
        data = _validated(ReasonInput, request)
        return self._respond(
            services.reservation_approve(reservation=self.get_object(), actor=request.user, reason=data["reason"])
        )

    @extend_schema(
        summary="Reject with a reason (admins)",
        request=RequiredReasonInput,
        responses={200: ReservationSerializer, **ERRORS},
    )
    @action(detail=True, methods=["post"])
    def reject(self, request: AuthenticatedRequest, pk: str | None = None) -> Response:
        data = _validated(RequiredReasonInput, request)
        return self._respond(
            services.reservation_reject(reservation=self.get_object(), actor=request.user, reason=data["reason"])
        )

    def _respond(self, reservation: Reservation, code: int = status.HTTP_200_OK) -> Response:
        fresh = selectors.reservation_list(user=self.request.user).get(pk=reservation.pk)
        return Response(self.get_serializer(fresh).data, status=code)


def _validated(serializer_class: type, request: Request) -> dict[str, Any]:
    serializer = serializer_class(data=request.data)
    if not serializer.is_valid():
        raise ValidationError(_with_horizon(serializer, request.user))
    return serializer.validated_data


def _with_horizon(serializer: Any, user: Any) -> Any:
    """A booking or extension ending beyond the calendar (year 9999, say) was meant as "as long as
    possible": its refusal also says how far ahead this person may book, and whose limit that is."""
    errors = serializer.errors
    codes = serializer.errors.get("end") and [error.code for error in errors["end"]]
    raw = serializer.initial_data.get("end") if isinstance(serializer.initial_data, dict) else None
    if codes != ["out_of_range"] or not isinstance(raw, str) or user.is_booking_admin or raw[:4] < "3000":
        return errors
    return {**errors, "end": [*errors["end"], booking_horizon(effective_limits(user))]}


def _parse_time(name: str, raw: str) -> Any:
    try:
        return AwareDateTimeField().to_internal_value(raw)
    except ValidationError as exc:
        raise ValidationError({name: exc.detail}) from exc


def _pick_gpus(node_name: str, count: int, start: Any, end: Any, profile: str = "", *, user: Any = None) -> list[Any]:
    node = Node.objects.filter(name=node_name).first()
    if node is None:
        raise InvalidBooking(f"No node named {node_name!r}.", field="node")
    # Pick on the grid the service will book on, so the GPUs picked are free for that exact slot.
    # Reserved capacity of groups ``user`` is not in is not offered (reservations/reserved.py).
    gpus = selectors.free_gpus(
        node=node, count=count, start=floor_to_grid(start), end=ceil_to_grid(end), profile=profile, user=user
    )
    if len(gpus) < count:
        what = f"{profile} slices" if profile else "GPUs"
        everyone = selectors.free_gpus(
            node=node, count=count, start=floor_to_grid(start), end=ceil_to_grid(end), profile=profile
        )
        more = len(everyone) - len(gpus)
        kept = f" ({more} more {'is' if more == 1 else 'are'} reserved for a group you are not in)" if more > 0 else ""
        raise SlotConflict(
            f"Only {len(gpus)} of the {count} {what} asked are free on {node.name} for that slot{kept}.",
            free=[gpu.pk for gpu in gpus],
        )
    return gpus


class AvailabilityView(APIView):
    @extend_schema(
        summary="Earliest windows where N GPUs of one node are free for H hours",
        parameters=[AvailabilityQuery],
        responses={200: AvailabilitySerializer, **READ_ERRORS},
    )
    def get(self, request: Request) -> Response:
        query = AvailabilityQuery(data=request.query_params)
        query.is_valid(raise_exception=True)
        data = query.validated_data
        windows = earliest_windows(
            gpu_count=data["gpus"],
            duration=timedelta(hours=data["hours"]),
            now=timezone.now(),
            after=data.get("after"),
            node_name=data.get("node"),
            min_memory_mib=memory_gb_to_mib(data.get("min_memory_gb")),
            profile=data.get("profile", ""),
            user=request.user,
        )
        return Response(AvailabilitySerializer({"results": windows}).data)


class GpuFilters(serializers.Serializer):
    node = serializers.CharField(required=False, max_length=63)
    model = serializers.CharField(required=False, max_length=100)
    min_memory_gb = serializers.IntegerField(required=False, min_value=0, max_value=100_000)


@extend_schema_view(
    list=extend_schema(
        summary="GPUs with their current holder and next booking",
        parameters=[
            OpenApiParameter("node", str, description="Node name."),
            OpenApiParameter("model", str, description="Part of the model name, e.g. A100."),
            OpenApiParameter("min_memory_gb", int, description="At least this much memory."),
        ],
        responses={200: GpuSerializer(many=True), **READ_ERRORS},
    ),
    retrieve=extend_schema(summary="One GPU", responses={200: GpuSerializer, **READ_ERRORS}),
)
class GpuViewSet(viewsets.ReadOnlyModelViewSet):
    serializer_class = GpuSerializer
    lookup_value_regex = r"[0-9]{1,18}"

    def get_queryset(self) -> QuerySet[Gpu]:
        filters = GpuFilters(data=self.request.query_params)
        filters.is_valid(raise_exception=True)
        data = filters.validated_data
        return selectors.gpu_list(
            now=timezone.now(),
            node=data.get("node"),
            model=data.get("model"),
            min_memory_mib=memory_gb_to_mib(data.get("min_memory_gb")),
        )
