from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.db.models import Count, QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.utils import timezone

from audit.admin import AuditedAdminMixin
from nodes.broker_users import BrokerUserError, broker_users_forget
from nodes.liveness import node_online
from nodes.mig import CardLayout, mig_layout_confirm, mig_layout_fingerprint
from nodes.models import AgentState, Gpu, Node, NodeEvent
from nodes.services import gpu_return_to_service, node_rotate_credentials
from nodes.signals import node_power_policy_changed


class GpuInline(admin.TabularInline):
    model = Gpu
    fk_name = "node"
    extra = 0
    fields = ("index", "uuid", "model", "memory_mib", "bookable", "drained_at", "drain_reason", "power_limit")
    readonly_fields = ("drained_at", "drain_reason", "power_limit")

    def get_queryset(self, request: HttpRequest) -> QuerySet[Gpu]:
        return super().get_queryset(request).select_related("telemetry")

    @admin.display(description="power limit now")
    def power_limit(self, obj: Gpu) -> str:
        """As the agent last reported it: lower than the card's default while the node's idle power cap holds it."""
        reading = getattr(obj, "telemetry", None)  # none before the first report
        if reading is None or reading.power_limit_w is None:
            return "–"
        return f"{reading.power_limit_w:.0f} W"


@admin.register(Node)
class NodeAdmin(AuditedAdminMixin, admin.ModelAdmin):
    list_display = (
        "name", "hostname", "status", "manager", "requires_approval", "gpu_count", "idle_power_cap", "agent"
    )  # fmt: skip
    list_filter = ("status", "manager", "requires_approval")
    search_fields = ("name", "hostname", "description")
    inlines = [GpuInline]
    actions = ["issue_agent_credentials"]
    readonly_fields = ("books_whole", "manager_state")  # the Slurm link sets them (docs/slurm.md)

    @admin.action(description="Issue new agent credentials (shown once)", permissions=["change"])
    def issue_agent_credentials(self, request: HttpRequest, queryset: QuerySet[Node]) -> TemplateResponse | None:
        configs, refused = [], []
        for node in queryset:
            try:
                configs.append(
                    {"node": node.name, "text": node_rotate_credentials(node=node, actor=request.user).as_config()}
                )
            except BrokerUserError as error:  # that node keeps its old credentials; the others' are shown
                refused.append(node.name)
                self.message_user(request, f"Node {node.name}: nothing changed: {error}", messages.ERROR)
        if not configs:
            return None  # back to the list, with the messages
        if refused:
            self.message_user(request, f"Credentials not changed for {', '.join(refused)}.", messages.WARNING)
        context = {**self.admin_site.each_context(request), "title": "Agent credentials", "configs": configs}
        response = TemplateResponse(request, "admin/nodes/agent_credentials.html", context)
        response["Cache-Control"] = "no-store"
        return response

    def save_model(self, request: HttpRequest, obj: Node, form: Any, change: bool) -> None:
        super().save_model(request, obj, form, change)
        if change and "idle_power_limit_pct" in form.changed_data:  # the agent hears it with its next snapshot
            node_power_policy_changed.send(sender=Node, node=obj, actor=request.user)

    def delete_model(self, request: HttpRequest, obj: Node) -> None:
        super().delete_model(request, obj)
        broker_users_forget([obj.broker_username])  # a deleted node's broker user goes with it

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Node]) -> None:
        usernames = list(queryset.values_list("broker_username", flat=True))
        super().delete_queryset(request, queryset)
        broker_users_forget(usernames)

    def get_queryset(self, request: HttpRequest) -> QuerySet[Node]:
        return super().get_queryset(request).select_related("agent_state").annotate(gpu_total=Count("gpus"))

    @admin.display(description="agent")
    def agent(self, obj: Node) -> str:
        state = getattr(obj, "agent_state", None)
        if state is None:
            return "never reported" if obj.agent_token_hash else "not registered"
        seen = timezone.localtime(state.last_seen).strftime("%Y-%m-%d %H:%M:%S")
        status = "online" if node_online(state, timezone.now()) else "OFFLINE"
        return f"{status} (last seen {seen}, snapshot v{state.applied_version})"

    @admin.display(description="idle power cap", ordering="idle_power_limit_pct")
    def idle_power_cap(self, obj: Node) -> str:
        return "off" if obj.idle_power_limit_pct is None else f"{obj.idle_power_limit_pct} %"

    @admin.display(description="GPUs", ordering="gpu_total")
    def gpu_count(self, obj: Node) -> int:
        return obj.gpu_total  # type: ignore[attr-defined]


@admin.register(Gpu)
class GpuAdmin(AuditedAdminMixin, admin.ModelAdmin):
    list_display = (
        "__str__",
        "model",
        "memory_mib",
        "bookable",
        "mig_mode",
        "profile",
        "gone_at",
        "drained_at",
        "uuid",
    )
    list_filter = (
        "node",
        "model",
        "bookable",
        "mig_mode",
        ("mig_change_at", admin.EmptyFieldListFilter),
        ("parent", admin.EmptyFieldListFilter),
        ("drained_at", admin.EmptyFieldListFilter),
    )
    search_fields = ("uuid", "model", "node__name")
    list_select_related = ("node",)
    raw_id_fields = ("parent",)
    readonly_fields = (
        "drained_at",
        "drain_reason",
        "mig_mode",
        "profile",
        "compute_slices",
        "memory_slices",
        "placement_start",
        "placement_size",
        "gone_at",
        "mig_layout_waiting",
        "reported_compute_slices",
    )
    actions = ["return_to_service", "confirm_mig_layout"]

    @admin.display(description="MIG layout waiting for confirmation")
    def mig_layout_waiting(self, obj: Gpu) -> str:
        """A card's change its agent reported, which counts for nothing until confirmed (nodes/mig.py)."""
        waiting = CardLayout.waiting(obj)
        if waiting is None:
            return "–"
        since = timezone.localtime(obj.mig_change_at).strftime("%Y-%m-%d %H:%M:%S") if obj.mig_change_at else ""
        return f"{CardLayout.confirmed(obj)} → {waiting} (reported {since}; card and slices not bookable until then)"

    @admin.action(
        description="Confirm the MIG layout the agent reports (its slices become bookable)", permissions=["change"]
    )
    def confirm_mig_layout(self, request: HttpRequest, queryset: QuerySet[Gpu]) -> TemplateResponse | None:
        """First a page with what each card's agent reports (a change of the card's numbers or mode beside the
        confirmed ones, its slices); confirming there applies exactly that, and refuses a card whose layout
        changed after the page was shown."""
        cards = list(queryset.select_related("node").order_by("node__name", "index", "pk"))
        if "apply" not in request.POST:
            context = {
                **self.admin_site.each_context(request),
                "title": "Confirm MIG layouts",
                "cards": [_layout_shown(card) for card in cards],
                "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
                "action": "confirm_mig_layout",
            }
            return TemplateResponse(request, "admin/nodes/confirm_mig_layout.html", context)
        for card in cards:
            waiting = CardLayout.waiting(card)
            change = f"{CardLayout.confirmed(card)} → {waiting} confirmed; " if waiting else ""
            try:
                confirmed = mig_layout_confirm(
                    card=card, actor=request.user, seen=request.POST.get(f"seen-{card.pk}", "")
                )
            except ValueError as refusal:
                self.message_user(request, str(refusal), messages.ERROR)
                continue
            if waiting is not None and not waiting.mig_mode:
                self.message_user(request, f"{card}: {change}it is booked as one GPU again.", messages.SUCCESS)
            else:
                profiles = ", ".join(piece.profile for piece in confirmed)
                self.message_user(
                    request, f"{card}: {change}{len(confirmed)} slice(s) bookable ({profiles}).", messages.SUCCESS
                )
        return None

    @admin.action(description="Return drained GPUs to service", permissions=["change"])
    def return_to_service(self, request: HttpRequest, queryset: QuerySet[Gpu]) -> None:
        returned = sum(gpu_return_to_service(gpu=gpu, actor=request.user) for gpu in queryset)
        self.message_user(request, f"{returned} GPU(s) returned to service.", messages.SUCCESS)


def _layout_shown(card: Gpu) -> dict[str, Any]:
    """A card as the confirmation page shows it, with the fingerprint of what it shows."""
    waiting = CardLayout.waiting(card)
    slices = [] if card.parent_id is not None else card.slices.filter(gone_at__isnull=True).order_by("placement_start")
    return {
        "card": card,
        "confirmed": CardLayout.confirmed(card),
        "waiting": waiting,
        "slices": [
            {
                "piece": piece,
                "compute": piece.compute_slices,
                "reported_compute": piece.reported_compute_slices,
                "bookable": piece.bookable,
            }
            for piece in slices
        ],
        "seen": mig_layout_fingerprint(card),
    }


class ReadOnlyAdmin(admin.ModelAdmin):
    """Written only by agents' reports: admins look, nobody edits."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.register(AgentState)
class AgentStateAdmin(ReadOnlyAdmin):
    list_display = ("node", "last_seen", "agent_version", "backend", "driver_version", "applied_version")
    list_select_related = ("node",)


@admin.register(NodeEvent)
class NodeEventAdmin(ReadOnlyAdmin):
    list_display = ("at", "node", "kind", "gpu", "user", "reservation_id", "message")
    list_filter = ("kind", "node")
    search_fields = ("user", "message", "gpu__uuid")
    date_hierarchy = "at"
    list_select_related = ("node", "gpu__node")
