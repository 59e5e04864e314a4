from __future__ import annotations

from django.contrib import admin

from waitlist.models import Entry


@admin.register(Entry)
class EntryAdmin(admin.ModelAdmin):
    """Read-only: entries change through the waitlist's services (join, leave, claim, decline), which keep the
    offers' slots and the audit trail right. The per-node queue in service order is at /waitlist/queue/."""

    list_display = ("pk", "user", "want_text", "earliest_start", "latest_end", "status", "claim_by", "created_at")
    list_filter = ("status", "node")
    search_fields = ("user__username",)
    date_hierarchy = "created_at"

    def has_add_permission(self, request: object) -> bool:
        return False

    def has_change_permission(self, request: object, obj: object = None) -> bool:
        return False
