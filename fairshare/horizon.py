"""The optional cap on how far ahead a person far over their share may book (FAIRSHARE_HORIZON_CAP, off by
default): a rule registered with reservations.limits.horizon_caps, so every booking and extension obeys it."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.utils import timezone

from fairshare.factors import fairshare_for
from reservations.limits import HorizonCap


def horizon_cap(user: Any) -> HorizonCap | None:
    if not settings.FAIRSHARE_HORIZON_CAP or getattr(user, "pk", None) is None or user.is_booking_admin:
        return None
    factor = fairshare_for([user.pk], now=timezone.now())[user.pk].factor
    below, days = settings.FAIRSHARE_HORIZON_CAP_BELOW, settings.FAIRSHARE_HORIZON_CAP_DAYS
    if factor >= below:
        return None
    return HorizonCap(days=days, reason=f"fair share: your factor {factor:.2f} is under {below:g}")
