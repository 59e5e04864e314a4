"""REST API for environments: the list people pick from, and launches in their bookings (thin over services)."""

from __future__ import annotations

from django.db.models import QuerySet
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response

from accounts.http import AuthenticatedRequest
from environments import services
from environments.models import Environment, Launch
from environments.selectors import ID_RE, environments_offered, launches_visible
from environments.serializers import EnvironmentSerializer, LaunchInput, LaunchSerializer
from kernel.api_schema import ERRORS
from reservations import selectors as reservation_selectors
from reservations.exceptions import InvalidBooking


@extend_schema_view(
    list=extend_schema(
        summary="The environments you can launch in a booking", responses={200: EnvironmentSerializer(many=True)}
    ),
    retrieve=extend_schema(summary="One environment", responses={200: EnvironmentSerializer, **ERRORS}),
)
class EnvironmentViewSet(viewsets.ReadOnlyModelViewSet):
    serializer_class = EnvironmentSerializer
    queryset = Environment.objects.none()
    lookup_value_regex = r"[0-9]{1,18}"

    def get_queryset(self) -> QuerySet[Environment]:
        return environments_offered()


@extend_schema_view(
    list=extend_schema(
        summary="Launches in your bookings (admins: everyone's)",
        parameters=[OpenApiParameter("reservation", int, description="Only this booking's launches.")],
        responses={200: LaunchSerializer(many=True), **ERRORS},
    ),
    retrieve=extend_schema(
        summary="One launch: state, connection, output", responses={200: LaunchSerializer, **ERRORS}
    ),
)
class LaunchViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    serializer_class = LaunchSerializer
    queryset = Launch.objects.none()
    lookup_value_regex = r"[0-9]{1,18}"
    request: AuthenticatedRequest

    def get_queryset(self) -> QuerySet[Launch]:
        launches = launches_visible(user=self.request.user)
        reservation = self.request.query_params.get("reservation")
        if self.action == "list" and reservation:
            if not ID_RE.fullmatch(reservation):
                raise ValidationError({"reservation": "A booking's id is a whole number."})
            launches = launches.filter(reservation_id=int(reservation))
        return launches.order_by("-requested_at", "-pk")

    @extend_schema(
        summary="Launch an environment in your booking",
        description="Runs the environment on the booking's node as your unix account, with only the booking's "
        "GPUs: at once when the slot runs, at its start when it is still to come; it ends with the slot (after "
        "the node's grace), on stop, or when the booking is released or cancelled. Only the booking's holder may "
        "launch; a booking runs at most a few at once.",
        request=LaunchInput,
        responses={201: LaunchSerializer, **ERRORS},
    )
    def create(self, request: AuthenticatedRequest) -> Response:
        serializer = LaunchInput(data=request.data)
        if not serializer.is_valid():
            raise ValidationError(serializer.errors)
        data = serializer.validated_data
        reservation = (
            reservation_selectors.reservations_actionable(user=request.user).filter(pk=data["reservation"]).first()
        )
        if reservation is None:
            raise InvalidBooking(f"No booking #{data['reservation']} of yours.", field="reservation")
        environment = environments_offered().filter(pk=data["environment"]).first()
        if environment is None:
            raise InvalidBooking(
                f"No environment #{data['environment']} to launch: GET /api/v1/environments/ lists them.",
                field="environment",
            )
        launch = services.launch_create(user=request.user, reservation=reservation, environment=environment)
        return self._respond(launch, status.HTTP_201_CREATED)

    @extend_schema(
        summary="Stop a launch (and everything it started)", request=None, responses={200: LaunchSerializer, **ERRORS}
    )
    @action(detail=True, methods=["post"])
    def stop(self, request: AuthenticatedRequest, pk: str | None = None) -> Response:
        return self._respond(services.launch_stop(actor=request.user, launch=self.get_object()))

    def _respond(self, launch: Launch, code: int = status.HTTP_200_OK) -> Response:
        fresh = launches_visible(user=self.request.user).get(pk=launch.pk)
        return Response(self.get_serializer(fresh).data, status=code)
