"""Reserved capacity in admin: a group's GPUs (or any N GPUs of a node) over a window, once or repeating.

The form refuses what the booking rule could not apply, with a message saying what to change: an end before
the start, GPUs of another node, both GPUs and a count (or neither), more GPUs than the node can book, a
repeat rule or zone that reservations/recurrence.py refuses (the same bounds as recurring bookings).
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.http import HttpRequest

from audit.admin import AuditedAdminMixin
from kernel.fields import moment_problem
from nodes.models import Gpu
from reservations.exceptions import InvalidBooking
from reservations.models import ReservedCapacity, ReservedRelease
from reservations.reserved import MAX_RELEASE_HOURS, capacity_of, occurrence_periods, release_hours

# Which form field a refusal of reservations/recurrence.py is about.
_RULE_FIELDS = {"repeat": "rule", "timezone": "zone", "end": "end"}


class ReservedCapacityForm(forms.ModelForm):
    class Meta:
        model = ReservedCapacity
        fields = (
            "group",
            "node",
            "gpus",
            "count",
            "gpu_model",
            "label",
            "start",
            "end",
            "rule",
            "zone",
            "release_hours_before",
        )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if "gpus" in self.fields:
            gpus = self.fields["gpus"]
            assert isinstance(gpus, forms.ModelMultipleChoiceField)
            gpus.queryset = Gpu.objects.filter(gone_at__isnull=True).select_related("node")

    def clean(self) -> dict[str, Any]:
        super().clean()
        data = self.cleaned_data
        start, end, node = data.get("start"), data.get("end"), data.get("node")
        for name in ("start", "end"):
            problem = moment_problem(data[name]) if data.get(name) else None
            if problem:
                self.add_error(name, problem)
        if start and end and end <= start:
            self.add_error("end", "The end must be after the start.")
        hours = data.get("release_hours_before")
        if hours is not None and hours > MAX_RELEASE_HOURS:
            self.add_error(
                "release_hours_before", f"Release at most {MAX_RELEASE_HOURS} hours (a year) before the start."
            )
        gpus, count = list(data.get("gpus") or []), data.get("count")
        if gpus and count:
            self.add_error("count", "Reserve either named GPUs or a count of the node's GPUs, not both.")
        elif not gpus and not count:
            self.add_error("gpus", "Choose the GPUs to reserve, or give a count (any N GPUs of the node).")
        model = (data.get("gpu_model") or "").strip()
        if node is None and not (count and model):
            self.add_error(
                "node", "Choose the node, or give a count and a GPU model to keep GPUs of that model anywhere."
            )
        if gpus and model:
            self.add_error("gpu_model", "A model goes with a count: named GPUs are chosen by themselves.")
        if node is not None:
            elsewhere = [str(gpu) for gpu in gpus if gpu.node_id != node.pk]
            if elsewhere:
                self.add_error("gpus", f"{', '.join(elsewhere)} not on node {node.name}: choose GPUs of {node.name}.")
        if count and (node is not None or model):
            trial = ReservedCapacity(node=node, gpu_model=model, count=count)
            capacity = capacity_of(trial)
            if count > capacity:
                self.add_error(
                    "count", f"{trial.where} has {capacity} bookable GPUs: reserve at most {capacity} of them."
                )
        if not self.errors and start and end:
            self._check_rule(data)
        return data

    def _check_rule(self, data: dict[str, Any]) -> None:
        trial = ReservedCapacity(
            start=data["start"], end=data["end"], rule=data.get("rule", ""), zone=data.get("zone", "")
        )
        if trial.rule.strip() or trial.zone.strip():
            try:
                occurrence_periods(trial)
            except InvalidBooking as exc:
                field = _RULE_FIELDS.get(str(exc.details.get("field")), "rule")
                self.add_error(field, exc.message)


class ReleaseInline(admin.TabularInline):
    model = ReservedRelease
    fields = ("occurrence_start", "released_at")
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(ReservedCapacity)
class ReservedCapacityAdmin(AuditedAdminMixin, admin.ModelAdmin):
    form = ReservedCapacityForm
    list_display = ("group", "node", "reserved", "label", "start", "end", "rule", "zone", "releases")
    list_filter = ("node", "group")
    search_fields = ("group__name", "node__name", "label")
    list_select_related = ("group", "node")
    filter_horizontal = ("gpus",)
    inlines = [ReleaseInline]

    @admin.display(description="reserved")
    def reserved(self, obj: ReservedCapacity) -> str:
        if obj.count:
            return f"any {obj.count} GPUs" + (f" of model {obj.gpu_model}" if obj.gpu_model else "")
        return ", ".join(f"GPU {gpu.index}" + (f" {gpu.profile}" if gpu.parent_id else "") for gpu in obj.gpus.all())

    @admin.display(description="releases")
    def releases(self, obj: ReservedCapacity) -> str:
        hours = release_hours(obj)
        return f"{hours} h before" if hours else "never"

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        if not change:
            obj.created_by = request.user
        super().save_model(request, obj, form, change)
