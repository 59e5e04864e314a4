from __future__ import annotations

from django.contrib import admin

from fairshare.models import GroupShare


@admin.register(GroupShare)
class GroupShareAdmin(admin.ModelAdmin):
    """Each group's shares; everyone's factors, computed from them, are on the staff page /fairshare/."""

    list_display = ("group", "shares")
    search_fields = ("group__name",)
    autocomplete_fields = ("group",)
