from __future__ import annotations

from django.contrib import admin

from notifications.models import MailPreferences, Notification


@admin.register(Notification)
class NotificationAdmin(admin.ModelAdmin):
    list_display = ("kind", "user", "reservation", "moment", "sent_at", "skipped")
    list_filter = ("kind", "skipped")
    search_fields = ("user__username", "reservation__id")
    date_hierarchy = "sent_at"

    # The mail log is the record of what went out: read-only.
    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


@admin.register(MailPreferences)
class MailPreferencesAdmin(admin.ModelAdmin):
    list_display = ("user", "booking_received", "decisions", "slot_starting", "slot_ending", "slot_ended")
    search_fields = ("user__username",)
