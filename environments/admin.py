from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from environments.models import Environment, Launch
from environments.services import launch_stop
from kernel.admin import ReadOnlyAdmin
from kernel.api import DomainError


@admin.register(Environment)
class EnvironmentAdmin(admin.ModelAdmin):
    list_display = ("name", "kind", "image", "enabled")
    list_filter = ("kind", "enabled")
    search_fields = ("name", "image")


@admin.register(Launch)
class LaunchAdmin(ReadOnlyAdmin):
    """What runs in bookings, as the nodes report it: read only (people launch from their bookings), with Stop."""

    list_display = ("__str__", "state", "requested_by", "requested_at", "started_at", "ended_at", "exit_code")
    list_filter = ("state", "environment")
    search_fields = ("reservation__id", "requested_by__username", "environment__name")
    list_select_related = ("environment", "requested_by")
    # The notebook's token is its holder's alone: admins see that a launch runs, not its key.
    exclude = ("token",)
    readonly_fields = tuple(
        field.name for field in Launch._meta.get_fields() if field.concrete and field.name not in ("id", "token")
    )
    actions = ("stop",)

    @admin.action(description="Stop the selected launches (and all they started)")
    def stop(self, request: HttpRequest, queryset: QuerySet[Launch]) -> None:
        stopped = 0
        for launch in queryset.select_related("reservation"):
            try:
                launch_stop(actor=request.user, launch=launch)
                stopped += 1
            except DomainError as error:
                messages.warning(request, f"{launch}: {error}")
        messages.success(request, f"{stopped} launch{'es' if stopped != 1 else ''} asked to stop.")
