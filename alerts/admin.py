"""Alerts in admin: every alert, open and resolved, filtered by kind, state and node; "Resolve" for
what needs a person (a drained GPU goes back to service through it). And the periodic jobs, with
their last success (read-only: the worker writes them)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone

from alerts.jobs import job_states
from alerts.models import Alert, PeriodicJob
from alerts.records import alert_resolve_by_admin
from alerts.selectors import alert_summary


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
    list_display = ("kind", "node", "gpu", "username", "summary", "opened_at", "resolved_at", "is_open", "mailed_at")
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


@admin.register(PeriodicJob)
class PeriodicJobAdmin(admin.ModelAdmin):
    list_display = ("name", "task", "every", "last_success_at", "late", "watched_since")
    readonly_fields = ("name", "task", "last_success_at", "watched_since")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def _state(self, job: PeriodicJob) -> Any:
        return next((state for state in job_states(now=timezone.now()) if state.name == job.name), None)

    @admin.display(description="every")
    def every(self, job: PeriodicJob) -> str:
        state = self._state(job)
        return f"{state.period.total_seconds():.0f} s" if state else "not in the schedule any more"

    @admin.display(boolean=True, description="late")
    def late(self, job: PeriodicJob) -> bool | None:
        state = self._state(job)
        return state.is_late(timezone.now()) if state else None
