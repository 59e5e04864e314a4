"""The status page's data over REST (GET /api/v1/status/)."""

from __future__ import annotations

from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.http import AuthenticatedRequest
from kernel.api_schema import READ_ERRORS
from live.serializers import FleetStatusSerializer
from reservations.fleet import fleet_status, for_viewer


class FleetStatusView(APIView):
    """The status page's data: the websocket topic "status" sends the same, then keeps it fresh."""

    @extend_schema(
        summary="Every GPU's live status: telemetry, holder, next booking, offline/drained/maintenance",
        responses={200: FleetStatusSerializer, **READ_ERRORS},
    )
    def get(self, request: AuthenticatedRequest) -> Response:
        now = timezone.now()
        nodes = fleet_status(now=now, history=True)
        return Response({"now": now, "nodes": for_viewer(nodes, admin=request.user.is_booking_admin)})
