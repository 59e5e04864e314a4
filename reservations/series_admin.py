"""Recurring bookings in admin: read-only (a series changes through its services: the series page and the API,
where every occurrence is checked as a booking; its occurrences are reservations, in their own admin)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html

from kernel.admin import ReadOnlyAdmin
from reservations.models import Reservation, Series


class OccurrenceInline(admin.TabularInline):
    model = Reservation
    fk_name = "series"
    fields = ("link", "series_day", "start", "end", "status")
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = False

    @admin.display(description="reservation")
    def link(self, obj: Reservation) -> str:
        return format_html(
            '<a href="{}">#{}</a>', reverse("admin:reservations_reservation_change", args=[obj.pk]), obj.pk
        )

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Series)
class SeriesAdmin(ReadOnlyAdmin):
    list_display = ("id", "user", "node", "rule", "zone", "start_time", "duration", "mode", "ends_before", "created_at")
    list_filter = ("mode", "node")
    search_fields = ("user__username", "rule", "purpose")
    inlines = [OccurrenceInline]
