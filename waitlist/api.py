"""REST API for the waitlist: thin views over waitlist/services.py."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db.models import QuerySet
from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from accounts.http import AuthenticatedRequest
from kernel.api_schema import ERRORS
from nodes.models import Gpu, Node
from reservations.exceptions import InvalidBooking
from waitlist import selectors, services
from waitlist.models import Entry
from waitlist.serializers import EntrySerializer, JoinInput


@extend_schema_view(
    list=extend_schema(
        summary="Your waitlist entries (admins: ?all=true for everyone's)",
        parameters=[
            OpenApiParameter("all", bool, description="Admins: everyone's entries."),
            OpenApiParameter("open", bool, description="Only entries still waiting or offered a slot."),
        ],
        responses={200: EntrySerializer(many=True), **ERRORS},
    ),
    retrieve=extend_schema(summary="One waitlist entry", responses={200: EntrySerializer, **ERRORS}),
)
class WaitlistViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    serializer_class = EntrySerializer
    queryset = Entry.objects.none()  # for the schema; get_queryset() decides what is visible
    lookup_value_regex = r"[0-9]{1,18}"
    request: AuthenticatedRequest

    def get_queryset(self) -> QuerySet[Entry]:
        qs = self._visible()
        if self.action == "list" and self.request.query_params.get("open", "").lower() in {"1", "true", "yes"}:
            qs = qs.filter(status__in=Entry.OPEN_STATUSES)
        return qs.order_by("-created_at", "-pk")

    def _visible(self) -> QuerySet[Entry]:
        """The entries this person may see: their own, or everyone's for an admin (listed with ``?all=1``)."""
        user = self.request.user
        qs = Entry.objects.select_related("user", "node", "reservation").prefetch_related("gpus")
        everyone = user.is_booking_admin and (
            self.action != "list" or self.request.query_params.get("all", "").lower() in {"1", "true", "yes"}
        )
        return qs if everyone else qs.filter(user=user)

    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        page = self.paginate_queryset(self.get_queryset())
        entries = selectors.with_positions(list(page if page is not None else self.get_queryset()), now=timezone.now())
        data = self.get_serializer(entries, many=True).data
        return self.get_paginated_response(data) if page is not None else Response(data)

    def retrieve(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return self._respond(self.get_object())

    @extend_schema(
        summary="Join the waitlist",
        description="Wait for these GPUs, or any `count` GPUs (or MIG slices of `profile`) on a node, or any `count` "
        "of a model, for `duration_minutes` inside [earliest_start, latest_end]. When capacity frees up, the best "
        "waiting entry (fair share, then arrival) is offered a slot: booked at once with `auto_book` (the "
        "default), or held for WAITLIST_CLAIM_MINUTES for a claim. Free already: offered at once.",
        request=JoinInput,
        responses={201: EntrySerializer, **ERRORS},
    )
    def create(self, request: AuthenticatedRequest) -> Response:
        serializer = JoinInput(data=request.data)
        if not serializer.is_valid():
            raise ValidationError(serializer.errors)
        data = serializer.validated_data
        want = services.Want(
            gpus=_gpus(data.get("gpus", [])),
            node=_node(data["node"]) if "node" in data else None,
            gpu_model=data.get("model", ""),
            profile=data["profile"],
            count=data["count"],
            earliest_start=data["earliest_start"],
            latest_end=data["latest_end"],
            duration=timedelta(minutes=data["duration_minutes"]),
            purpose=data["purpose"],
            auto_book=data["auto_book"],
        )
        return self._respond(services.entry_join(user=request.user, want=want), status.HTTP_201_CREATED)

    @extend_schema(
        summary="Leave the waitlist (a slot on offer passes on)",
        request=None,
        responses={200: EntrySerializer, **ERRORS},
    )
    @action(detail=True, methods=["post"])
    def leave(self, request: AuthenticatedRequest, pk: str | None = None) -> Response:
        return self._respond(services.entry_leave(entry=self.get_object(), actor=request.user))

    @extend_schema(
        summary="Claim the slot on offer: it becomes your booking",
        request=None,
        responses={200: EntrySerializer, **ERRORS},
    )
    @action(detail=True, methods=["post"])
    def claim(self, request: AuthenticatedRequest, pk: str | None = None) -> Response:
        return self._respond(services.offer_claim(entry=self.get_object(), actor=request.user))

    @extend_schema(
        summary="Decline the slot on offer (it passes on; the entry ends)",
        request=None,
        responses={200: EntrySerializer, **ERRORS},
    )
    @action(detail=True, methods=["post"])
    def decline(self, request: AuthenticatedRequest, pk: str | None = None) -> Response:
        return self._respond(services.offer_decline(entry=self.get_object(), actor=request.user))

    def _respond(self, entry: Entry, code: int = status.HTTP_200_OK) -> Response:
        fresh = self._visible().get(pk=entry.pk)  # as it is now, whatever the list's filters
        selectors.with_positions([fresh], now=timezone.now())
        return Response(self.get_serializer(fresh).data, status=code)


def _gpus(ids: list[int]) -> list[Gpu]:
    found = list(Gpu.objects.select_related("node").filter(pk__in=ids))
    missing = sorted(set(ids) - {gpu.pk for gpu in found})
    if missing:
        raise InvalidBooking(f"No GPU with id {', '.join(map(str, missing))}.", field="gpus")
    return found


def _node(name: str) -> Node:
    node = Node.objects.filter(name=name).first()
    if node is None:
        raise InvalidBooking(f"No node named {name!r}.", field="node")
    return node
