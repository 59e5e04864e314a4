from django.contrib import admin
from django.contrib.auth.admin import UserAdmin as DjangoUserAdmin

from accounts.models import User


@admin.register(User)
class UserAdmin(DjangoUserAdmin):
    list_display = ("username", "unix_username", "email", "first_name", "last_name", "is_staff")
    search_fields = ("username", "unix_username", "email", "first_name", "last_name")
    fieldsets = (
        *DjangoUserAdmin.fieldsets,
        ("GPU nodes", {"fields": ("unix_username",)}),
    )
    add_fieldsets = (
        *DjangoUserAdmin.add_fieldsets,
        ("GPU nodes", {"fields": ("unix_username",)}),
    )
