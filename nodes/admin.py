from __future__ import annotations

from django.contrib import admin
from django.db.models import Count, QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse

from audit.admin import AuditedAdminMixin
from nodes.models import Gpu, Node
from nodes.services import node_rotate_credentials


class GpuInline(admin.TabularInline):
    model = Gpu
    fk_name = "node"
    extra = 0
    fields = ("index", "uuid", "model", "memory_mib", "bookable")


@admin.register(Node)
class NodeAdmin(AuditedAdminMixin, admin.ModelAdmin):
    list_display = ("name", "hostname", "status", "requires_approval", "gpu_count")
    list_filter = ("status", "requires_approval")
    search_fields = ("name", "hostname", "description")
    inlines = [GpuInline]
    actions = ["issue_agent_credentials"]

    @admin.action(description="Issue new agent credentials (shown once)", permissions=["change"])
    def issue_agent_credentials(self, request: HttpRequest, queryset: QuerySet[Node]) -> TemplateResponse:
        configs = [
            {"node": node.name, "text": node_rotate_credentials(node=node, actor=request.user).as_config()}
            for node in queryset
        ]
        context = {**self.admin_site.each_context(request), "title": "Agent credentials", "configs": configs}
        response = TemplateResponse(request, "admin/nodes/agent_credentials.html", context)
        response["Cache-Control"] = "no-store"
        return response

    def get_queryset(self, request: HttpRequest) -> QuerySet[Node]:
        return super().get_queryset(request).annotate(gpu_total=Count("gpus"))

    @admin.display(description="GPUs", ordering="gpu_total")
    def gpu_count(self, obj: Node) -> int:
        return obj.gpu_total  # type: ignore[attr-defined]


@admin.register(Gpu)
class GpuAdmin(AuditedAdminMixin, admin.ModelAdmin):
    list_display = ("__str__", "model", "memory_mib", "bookable", "uuid")
    list_filter = ("node", "model", "bookable")
    search_fields = ("uuid", "model", "node__name")
    list_select_related = ("node",)
    raw_id_fields = ("parent",)
