from django.contrib import admin
from django.contrib.auth.admin import UserAdmin as DjangoUserAdmin

from accounts.models import ApiToken, User


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


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    """Tokens are created by their owners (profile, API, or create_api_token); admins can see and revoke."""

    list_display = ("user", "name", "prefix", "created_at", "expires_at", "last_used_at", "revoked_at")
    list_filter = (("revoked_at", admin.EmptyFieldListFilter),)
    search_fields = ("user__username", "name", "prefix")
    readonly_fields = ("user", "name", "prefix", "created_at", "expires_at", "last_used_at", "revoked_at")
    exclude = ("key_hash",)
    actions = ["revoke_selected"]

    def has_add_permission(self, request):  # type: ignore[no-untyped-def]
        return False

    @admin.action(description="Revoke selected tokens", permissions=["change"])
    def revoke_selected(self, request, queryset):  # type: ignore[no-untyped-def]
        from accounts.services import api_token_revoke

        for token in queryset.filter(revoked_at=None):
            api_token_revoke(token=token, actor=request.user)
        self.message_user(request, "Revoked.")
