from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.forms.models import model_to_dict
from django.http import HttpRequest

from audit.models import AuditEntry
from audit.services import audit_record
from kernel.admin import ReadOnlyAdmin


@admin.register(AuditEntry)
class AuditEntryAdmin(ReadOnlyAdmin):
    """Read-only: the trail is written by the services, never edited by hand."""

    list_display = ("created_at", "actor_name", "action", "target_repr", "reason")
    list_filter = ("action", "target_type", ("created_at", admin.DateFieldListFilter))
    search_fields = ("actor_name", "action", "target_repr", "target_id", "reason")
    date_hierarchy = "created_at"
    readonly_fields = [f.name for f in AuditEntry._meta.fields]


def _jsonable(instance: Any) -> dict[str, Any]:
    data = model_to_dict(instance)
    return {
        key: (
            [getattr(v, "pk", v) for v in value]
            if isinstance(value, list | tuple)
            else value
            if isinstance(value, str | int | float | bool | type(None))
            else str(value)
        )
        for key, value in data.items()
    }


class AuditedAdminMixin:
    """Records admin edits of plain configuration (nodes, GPUs, limits, maintenance) in the trail."""

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        before = _jsonable(type(obj).objects.get(pk=obj.pk)) if change and obj.pk else None
        super().save_model(request, obj, form, change)  # type: ignore[misc]
        action = f"{obj._meta.model_name}.{'change' if change else 'create'}"
        audit_record(actor=request.user, action=action, target=obj, before=before, after=_jsonable(obj))

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        audit_record(actor=request.user, action=f"{obj._meta.model_name}.delete", target=obj, before=_jsonable(obj))
        super().delete_model(request, obj)  # type: ignore[misc]

    def delete_queryset(self, request: HttpRequest, queryset: Any) -> None:
        for obj in queryset:
            audit_record(actor=request.user, action=f"{obj._meta.model_name}.delete", target=obj, before=_jsonable(obj))
        super().delete_queryset(request, queryset)  # type: ignore[misc]
