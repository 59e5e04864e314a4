"""``/api/v1/me/``: who the caller is, their limits and their use of them.

Here rather than in accounts, which sits below reservations and must not import its limits.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.http import AuthenticatedRequest
from accounts.me_parts import me_parts
from accounts.serializers import MeSerializer
from kernel.api_schema import READ_ERRORS
from reservations.limits import WEEK, Period, busiest_week, effective_limits, gpus_number, peak_gpus
from reservations.selectors import held_periods


def _number(value: Any) -> float | None:
    return None if value is None else float(value)


class MeView(APIView):
    @extend_schema(summary="You, your limits and your use of them", responses={200: MeSerializer, **READ_ERRORS})
    def get(self, request: AuthenticatedRequest) -> Response:
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
                "used": gpus_number(peak_gpus(held, now, now + timedelta(seconds=1))),
            },
            "weekly_gpu_hours": {
                "allowed": _number(limits.weekly_gpu_hours),
                "used": round(used_seconds / 3600, 2),
            },
            "max_slot_hours": _number(limits.max_slot_hours),
            "max_days_ahead": limits.max_days_ahead,
            **me_parts.read(user=user, now=now),
        }
        return Response(MeSerializer(data).data)
