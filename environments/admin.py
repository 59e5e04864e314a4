from django.contrib import admin

from environments.models import Environment


@admin.register(Environment)
class EnvironmentAdmin(admin.ModelAdmin):
    list_display = ("name", "kind", "image", "enabled")
    list_filter = ("kind", "enabled")
    search_fields = ("name", "image")
