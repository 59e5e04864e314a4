from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from notifications.models import MailPreferences, Notification


class WaitingFilter(admin.SimpleListFilter):
    title = "state"
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("waiting", "Waiting in the outbox"), ("sent", "Sent"), ("skipped", "Skipped")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Notification]) -> QuerySet[Notification]:
        if self.value() == "waiting":
            return queryset.filter(sent_at__isnull=True)
        if self.value() == "sent":
            return queryset.filter(sent_at__isnull=False, skipped=False)
        if self.value() == "skipped":
            return queryset.filter(skipped=True)
        return queryset


@admin.register(Notification)
class NotificationAdmin(admin.ModelAdmin):
    list_display = (
        "kind",
        "user",
        "reservation",
        "moment",
        "created_at",
        "sent_at",
        "attempts",
        "skipped",
        "skip_reason",
        "last_error",
    )
    list_filter = (WaitingFilter, "kind", "skipped")
    search_fields = ("user__username", "reservation__id")
    date_hierarchy = "created_at"

    # The mail log and outbox is the record of what went out and what waits: read-only.
    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


@admin.register(MailPreferences)
class MailPreferencesAdmin(admin.ModelAdmin):
    list_display = ("user", "booking_received", "decisions", "slot_starting", "slot_ending", "slot_ended")
    search_fields = ("user__username",)
