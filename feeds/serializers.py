from __future__ import annotations

from rest_framework import serializers


class FeedSerializer(serializers.Serializer):
    node = serializers.CharField(allow_null=True, help_text="The node whose bookings it has; null: your own bookings.")
    title = serializers.CharField()
    url = serializers.URLField(help_text="The subscription URL (iCalendar). Keep it private: it needs no login.")


class FeedsSerializer(serializers.Serializer):
    rotated_at = serializers.DateTimeField(
        allow_null=True, help_text="When these URLs were last replaced; null if never."
    )
    feeds = FeedSerializer(many=True)
