"""``/api/v1/me/`` (who the caller is, their limits and use) and ``/api/v1/tokens/`` (their API tokens)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db.models import QuerySet
from django.utils import timezone
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.models import ApiToken
from accounts.serializers import ApiTokenSerializer, MeSerializer, NewApiTokenSerializer
from accounts.services import api_token_create, api_token_revoke
from kernel.api_schema import ERRORS, READ_ERRORS
from reservations.limits import WEEK, Period, busiest_week, effective_limits, peak_gpus
from reservations.selectors import held_periods


def _number(value: Any) -> float | None:
    return None if value is None else float(value)


class MeView(APIView):
    @extend_schema(summary="You, your limits and your use of them", responses={200: MeSerializer, **READ_ERRORS})
    def get(self, request: Request) -> Response:
        user = request.user
        now = timezone.now()
        limits = effective_limits(user)
        held = held_periods(user=user, start=now - WEEK, end=now + WEEK)
        used_seconds, _ = busiest_week(held, Period(now, now + timedelta(seconds=2), 0))
        data = {
            "username": user.get_username(),
            "unix_username": user.unix_username,
            "email": user.email,
            "is_admin": user.is_booking_admin,
            "requires_approval": limits.requires_approval,
            "gpus_at_once": {
                "allowed": _number(limits.max_gpus_at_once),
                "used": peak_gpus(held, now, now + timedelta(seconds=1)),
            },
            "weekly_gpu_hours": {
                "allowed": _number(limits.weekly_gpu_hours),
                "used": round(used_seconds / 3600, 2),
            },
            "max_slot_hours": _number(limits.max_slot_hours),
            "max_days_ahead": limits.max_days_ahead,
        }
        return Response(MeSerializer(data).data)


@extend_schema_view(
    list=extend_schema(summary="Your API tokens", responses={200: ApiTokenSerializer(many=True), **READ_ERRORS}),
    create=extend_schema(
        summary="Create an API token (shown once)",
        request=ApiTokenSerializer,
        responses={201: NewApiTokenSerializer, **ERRORS},
    ),
    revoke=extend_schema(summary="Revoke a token", request=None, responses={200: ApiTokenSerializer, **ERRORS}),
)
class ApiTokenViewSet(mixins.ListModelMixin, viewsets.GenericViewSet):
    serializer_class = ApiTokenSerializer
    queryset = ApiToken.objects.none()  # for the schema; get_queryset() keeps to the caller's own
    lookup_value_regex = r"[0-9]{1,18}"

    def get_queryset(self) -> QuerySet[ApiToken]:
        return ApiToken.objects.filter(user=self.request.user).order_by("-created_at")

    def create(self, request: Request) -> Response:
        serializer = ApiTokenSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        try:
            record, token = api_token_create(
                user=request.user,
                name=serializer.validated_data["name"],
                expires_at=serializer.validated_data.get("expires_at"),
            )
        except ValueError as exc:
            raise ValidationError({"expires_at": [str(exc)]}) from exc
        data = NewApiTokenSerializer(record).data
        data["token"] = token
        return Response(data, status=status.HTTP_201_CREATED)

    @action(detail=True, methods=["post"])
    def revoke(self, request: Request, pk: str | None = None) -> Response:
        return Response(ApiTokenSerializer(api_token_revoke(token=self.get_object(), actor=request.user)).data)
