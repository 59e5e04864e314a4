"""Admin for the people who run the lab. Every reservation change goes through the services."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.db.models import Case, IntegerField, QuerySet, Value, When
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from audit.admin import AuditedAdminMixin
from nodes.models import Gpu
from reservations import services
from reservations.exceptions import BookingError
from reservations.models import Allocation, Limit, MaintenanceWindow, Reservation
from reservations.selectors import allocations_overlapping


class ReservationAddForm(forms.ModelForm):
    """Books through ``reservation_create`` so an admin's booking obeys the same rules.

    The service runs in ``clean()`` because that is the last point where Django admin can still
    show an error on the form; the booking is written in one transaction there or not at all.
    """

    gpus = forms.ModelMultipleChoiceField(queryset=Gpu.objects.select_related("node"), label="GPUs")

    class Meta:
        model = Reservation
        fields = ("user", "gpus", "start", "end", "purpose")

    def __init__(self, *args: Any, actor: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.actor = actor
        self.created: Reservation | None = None

    def clean(self) -> dict[str, Any]:
        super().clean()  # returns cleaned_data, which the stubs type as optional
        data = self.cleaned_data
        if self.errors:
            return data
        try:
            self.created = services.reservation_create(
                user=data["user"],
                gpus=list(data["gpus"]),
                start=data["start"],
                end=data["end"],
                purpose=data.get("purpose", ""),
                actor=self.actor,
            )
        except BookingError as exc:
            raise forms.ValidationError(exc.message) from exc
        return data

    def save(self, commit: bool = True) -> Reservation:
        assert self.created is not None
        self.instance = self.created
        return self.created

    def save_m2m(self) -> None:
        """The service wrote the allocations already."""


class ReasonForm(forms.Form):
    reason = forms.CharField(widget=forms.Textarea(attrs={"rows": 3, "cols": 60}), required=True)


class AllocationInline(admin.TabularInline):
    model = Allocation
    extra = 0
    can_delete = False
    fields = ("gpu", "start", "end", "active")
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class LiveFilter(admin.SimpleListFilter):
    title = "when"
    parameter_name = "when"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("upcoming", "Upcoming"), ("running", "Running now"), ("past", "Past")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Reservation]) -> QuerySet[Reservation]:
        from django.utils import timezone

        now = timezone.now()
        if self.value() == "upcoming":
            return queryset.filter(start__gt=now)
        if self.value() == "running":
            return queryset.filter(start__lte=now, end__gt=now)
        if self.value() == "past":
            return queryset.filter(end__lte=now)
        return queryset


@admin.register(Reservation)
class ReservationAdmin(admin.ModelAdmin):
    list_display = ("id", "user", "node", "gpu_list", "start", "end", "status", "purpose")
    list_filter = ("status", LiveFilter, "node", ("start", admin.DateFieldListFilter), "user")
    search_fields = ("user__username", "user__unix_username", "purpose", "node__name")
    date_hierarchy = "start"
    list_select_related = ("user", "node")
    inlines = [AllocationInline]
    actions = ["approve_selected", "reject_selected", "cancel_selected"]
    readonly_fields = (
        "user",
        "node",
        "start",
        "end",
        "purpose",
        "status",
        "created_at",
        "created_by",
        "decided_by",
        "decided_at",
        "decision_reason",
        "cancelled_by",
        "cancelled_at",
        "cancel_reason",
        "released_at",
    )

    def get_queryset(self, request: HttpRequest) -> QuerySet[Reservation]:
        return super().get_queryset(request).prefetch_related("allocations__gpu")

    def get_ordering(self, request: HttpRequest) -> list[Any]:
        # Pending first: that is what an admin opens this page for.
        pending_first = Case(
            When(status=Reservation.Status.PENDING, then=Value(0)),
            default=Value(1),
            output_field=IntegerField(),
        )
        return [pending_first.asc(), "-start"]

    @admin.display(description="GPUs")
    def gpu_list(self, obj: Reservation) -> str:
        return ", ".join(str(a.gpu.index) for a in sorted(obj.allocations.all(), key=lambda a: a.gpu.index))

    # Adding goes through the booking service; changing is done with the actions only.
    def get_form(self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any) -> Any:
        if obj is not None:
            return super().get_form(request, obj, change=change, **kwargs)
        kwargs["form"] = ReservationAddForm
        form_class = super().get_form(request, obj, change=change, **kwargs)

        class ActorBoundForm(form_class):  # type: ignore[valid-type, misc]
            def __init__(self, *args: Any, **form_kwargs: Any) -> None:
                super().__init__(*args, actor=request.user, **form_kwargs)

        return ActorBoundForm

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return self.readonly_fields if obj else ()

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return self.readonly_fields if obj else ("user", "gpus", "start", "end", "purpose")

    def get_inlines(self, request: HttpRequest, obj: Any) -> Any:
        return self.inlines if obj else []

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        """Saved by the service in the form's clean()."""

    def save_related(self, request: HttpRequest, form: Any, formsets: Any, change: bool) -> None:
        """Nothing to save: allocations are written by the service, and the change form is read-only."""

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Bookings are cancelled or rejected, never deleted: the record is part of the audit.
        return False

    # --- actions --------------------------------------------------------------------------

    def _apply(
        self,
        request: HttpRequest,
        queryset: QuerySet[Reservation],
        verb: str,
        operation: Callable[[Reservation], Any],
    ) -> None:
        done, failed = 0, []
        for reservation in queryset:
            try:
                operation(reservation)
                done += 1
            except BookingError as exc:
                failed.append(f"#{reservation.pk}: {exc.message}")
        if done:
            self.message_user(request, f"{verb} {done} reservation{'s' if done != 1 else ''}.", messages.SUCCESS)
        for line in failed:
            self.message_user(request, line, messages.ERROR)

    @admin.action(description="Approve selected reservations", permissions=["change"])
    def approve_selected(self, request: HttpRequest, queryset: QuerySet[Reservation]) -> None:
        self._apply(
            request,
            queryset,
            "Approved",
            lambda r: services.reservation_approve(reservation=r, actor=request.user),
        )

    def _with_reason(
        self,
        request: HttpRequest,
        queryset: QuerySet[Reservation],
        action: str,
        title: str,
        verb: str,
        operation: Callable[[Reservation, str], Any],
    ) -> HttpResponse | None:
        form = ReasonForm(request.POST if "apply" in request.POST else None)
        if "apply" in request.POST and form.is_valid():
            reason = form.cleaned_data["reason"]
            self._apply(request, queryset, verb, lambda r: operation(r, reason))
            return None
        context = {
            **self.admin_site.each_context(request),
            "title": title,
            "form": form,
            "queryset": queryset,
            "action": action,
            "action_checkbox_name": ACTION_CHECKBOX_NAME,
            "opts": self.model._meta,
        }
        return TemplateResponse(request, "admin/reservations/reason_action.html", context)

    @admin.action(description="Reject selected reservations (with a reason)", permissions=["change"])
    def reject_selected(self, request: HttpRequest, queryset: QuerySet[Reservation]) -> HttpResponse | None:
        return self._with_reason(
            request,
            queryset,
            "reject_selected",
            "Reject reservations",
            "Rejected",
            lambda r, reason: services.reservation_reject(reservation=r, actor=request.user, reason=reason),
        )

    @admin.action(description="Cancel selected reservations (with a reason)", permissions=["change"])
    def cancel_selected(self, request: HttpRequest, queryset: QuerySet[Reservation]) -> HttpResponse | None:
        return self._with_reason(
            request,
            queryset,
            "cancel_selected",
            "Cancel reservations",
            "Cancelled",
            lambda r, reason: services.reservation_cancel(reservation=r, actor=request.user, reason=reason),
        )


@admin.register(MaintenanceWindow)
class MaintenanceWindowAdmin(AuditedAdminMixin, admin.ModelAdmin):
    list_display = ("node", "gpu", "start", "end", "reason")
    list_filter = ("node", ("start", admin.DateFieldListFilter))
    search_fields = ("reason", "node__name")
    list_select_related = ("node", "gpu__node")
    exclude = ("created_by",)

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        if not change:
            obj.created_by = request.user
        super().save_model(request, obj, form, change)
        gpus = [obj.gpu] if obj.gpu_id else list(obj.node.gpus.all())
        overlapping = {a.reservation for a in allocations_overlapping(gpus=gpus, start=obj.start, end=obj.end)}
        if overlapping:
            listed = ", ".join(f"#{r.pk} ({r.user})" for r in sorted(overlapping, key=lambda r: r.pk))
            self.message_user(
                request,
                f"{len(overlapping)} booking(s) overlap this window and were kept: {listed}. "
                "Cancel them or tell their owners.",
                messages.WARNING,
            )


@admin.register(Limit)
class LimitAdmin(AuditedAdminMixin, admin.ModelAdmin):
    list_display = (
        "__str__",
        "max_gpus_at_once",
        "max_slot_hours",
        "weekly_gpu_hours",
        "max_days_ahead",
        "requires_approval",
    )
    list_filter = ("scope",)
    search_fields = ("group__name", "user__username")
    autocomplete_fields = ("user",)
    fieldsets = (
        ("Applies to", {"fields": ("scope", "group", "user")}),
        (
            "Limits (empty: not set here)",
            {
                "fields": (
                    "max_gpus_at_once",
                    "max_slot_hours",
                    "weekly_gpu_hours",
                    "max_days_ahead",
                    "requires_approval",
                )
            },
        ),
    )


# Recurring bookings (read-only) and reserved capacity for groups: their own modules, registered with this one.
from reservations import reserved_admin, series_admin  # noqa: E402, F401
