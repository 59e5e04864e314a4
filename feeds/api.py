"""``GET /api/v1/feeds/`` (your calendar feed URLs) and ``POST /api/v1/feeds/rotate/`` (new ones)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.http import AuthenticatedRequest
from accounts.models import User
from feeds.selectors import feed_listing
from feeds.serializers import FeedsSerializer
from feeds.services import feed_urls_rotate
from kernel.api_schema import ERRORS, READ_ERRORS


def _feeds(request: Request, user: User) -> dict[str, Any]:
    listing = feed_listing(user, request.build_absolute_uri)
    return {
        "rotated_at": listing.rotated_at,
        "feeds": [{"node": link.node, "title": link.title, "url": url} for link, url in listing.feeds],
    }


class FeedListView(APIView):
    @extend_schema(
        summary="Your calendar feed URLs",
        description=(
            "iCalendar subscription URLs for Outlook, Google Calendar and the like: your own bookings, "
            "and every node's bookings (holders' names; purposes only of your own). The URL is the key: "
            "anyone who has it can read the feed, so keep it private, and rotate if it leaked."
        ),
        responses={200: FeedsSerializer, **READ_ERRORS},
    )
    def get(self, request: AuthenticatedRequest) -> Response:
        return Response(FeedsSerializer(_feeds(request, request.user)).data)


class FeedRotateView(APIView):
    @extend_schema(
        summary="Replace your calendar feed URLs",
        description="Every earlier feed URL of yours answers 404 from now on; the response has the new ones.",
        request=None,
        responses={200: FeedsSerializer, **{code: ERRORS[code] for code in (401, 403, 429)}},
    )
    def post(self, request: AuthenticatedRequest) -> Response:
        feed_urls_rotate(user=request.user, actor=request.user)
        return Response(FeedsSerializer(_feeds(request, request.user)).data)
