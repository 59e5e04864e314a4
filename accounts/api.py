"""``/api/v1/tokens/``: the caller's API tokens. (``/api/v1/me/``, which shows limits, lives in reservations/me.py.)"""

from __future__ import annotations

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response

from accounts.http import AuthenticatedRequest
from accounts.models import ApiToken
from accounts.serializers import ApiTokenSerializer, NewApiTokenSerializer
from accounts.services import api_token_create, api_token_revoke
from kernel.api_schema import ERRORS, READ_ERRORS


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
    request: AuthenticatedRequest  # the API's default permission, IsAuthenticated, lets no one else in

    def get_queryset(self) -> QuerySet[ApiToken]:
        return ApiToken.objects.filter(user=self.request.user).order_by("-created_at")

    def create(self, request: AuthenticatedRequest) -> Response:
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
    def revoke(self, request: AuthenticatedRequest, pk: str | None = None) -> Response:
        return Response(ApiTokenSerializer(api_token_revoke(token=self.get_object(), actor=request.user)).data)
