"""Alerts in admin: every alert, open and resolved, filtered by kind, state and node; "Resolve" for
what needs a person (a drained GPU goes back to service through it)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from alerts.models import Alert
from alerts.selectors import alert_summary
from alerts.services import alert_resolve_by_admin


class OpenFilter(admin.SimpleListFilter):
    title = "state"
    parameter_name = "open"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("yes", "Open"), ("no", "Resolved")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Alert]) -> QuerySet[Alert]:
        if self.value() == "yes":
            return queryset.filter(resolved_at__isnull=True)
        if self.value() == "no":
            return queryset.filter(resolved_at__isnull=False)
        return queryset


@admin.register(Alert)
class AlertAdmin(admin.ModelAdmin):
    list_display = ("kind", "node", "gpu", "username", "summary", "opened_at", "resolved_at", "is_open", "notified_at")
    list_filter = (OpenFilter, "kind", "node")
    list_select_related = ("node", "gpu")
    search_fields = ("node__name", "username")
    date_hierarchy = "opened_at"
    actions = ("resolve",)
    readonly_fields = [f.name for f in Alert._meta.fields if f.name != "id"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    @admin.display(boolean=True, description="open")
    def is_open(self, alert: Alert) -> bool:
        return alert.is_open

    @admin.display(description="what")
    def summary(self, alert: Alert) -> str:
        return alert_summary(alert)

    @admin.action(description="Resolve the selected alerts (drained GPUs go back to service)")
    def resolve(self, request: HttpRequest, queryset: QuerySet[Alert]) -> None:
        done = sum(alert_resolve_by_admin(alert=alert, actor=request.user) for alert in queryset.select_related("gpu"))
        messages.success(request, f"{done} alert(s) resolved.")
