"""Serializer fields shared by the API."""

from __future__ import annotations

from datetime import datetime

from django.utils import timezone
from rest_framework import serializers


class AwareDateTimeField(serializers.DateTimeField):
    """An ISO 8601 datetime that must carry its offset: a naive time is ambiguous, so it is refused."""

    default_error_messages = {
        "naive": "Give the time zone, as an offset or Z: like 2026-12-03T14:00:00+01:00.",
    }

    def enforce_timezone(self, value: datetime) -> datetime:
        if timezone.is_naive(value):
            self.fail("naive")
        return super().enforce_timezone(value)
