from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib import admin, messages
from django.contrib.auth.admin import UserAdmin as DjangoUserAdmin
from django.contrib.auth.forms import UserChangeForm
from django.db.models import QuerySet
from django.forms import ModelForm
from django.http import HttpRequest

from accounts.models import ApiToken, User


class UnixUsernameRequestFilter(admin.SimpleListFilter):
    title = "unix username request"
    parameter_name = "unix_request"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin[Any]) -> list[tuple[str, str]]:
        return [("waiting", "waiting for confirmation")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[User]) -> QuerySet[User]:
        return queryset.exclude(unix_username_requested="") if self.value() == "waiting" else queryset


class PortalUserChangeForm(UserChangeForm):
    class Meta(UserChangeForm.Meta):
        help_texts = {
            "oidc_sub": (
                "The person's subject (sub) at the OpenID Connect provider: institutional login finds the account "
                "by it, never by username or email. Set it to link an existing account, which staff accounts always "
                "need (a refused login names the subject, as does the log); clear it to unlink."
            ),
        }


@admin.register(User)
class UserAdmin(DjangoUserAdmin):
    """People. Their unix username is set here as UNIX_USERNAME_SOURCE allows: by admins (``admin``;
    ``request``, where a researcher's request is confirmed on the approvals page or by typing the
    requested name into the field) or never (``directory``: it comes from the directory at each
    login). Deactivating someone ends their bookings (accounts/signals.py)."""

    list_display = ("username", "unix_username", "unix_username_requested", "email", "is_active", "is_staff")
    list_filter = (*DjangoUserAdmin.list_filter, UnixUsernameRequestFilter)
    search_fields = ("username", "unix_username", "unix_username_requested", "email", "first_name", "last_name")
    fieldsets = (
        *(DjangoUserAdmin.fieldsets or ()),
        ("GPU nodes", {"fields": ("unix_username", "unix_username_requested")}),
        ("Institutional login", {"fields": ("oidc_sub",)}),
    )
    form = PortalUserChangeForm
    add_fieldsets = (
        *DjangoUserAdmin.add_fieldsets,
        ("GPU nodes", {"fields": ("unix_username",)}),
    )
    # No bulk "confirm": it would confirm whatever a request says when the action runs, which its
    # owner may have changed since the admin looked. Confirming names the name: on the approvals
    # page, or by typing it into "unix username" here.
    actions = ["refuse_unix_usernames"]

    def get_readonly_fields(self, request: HttpRequest, obj: User | None = None) -> list[str]:
        readonly = [*super().get_readonly_fields(request, obj), "unix_username_requested"]
        if settings.UNIX_USERNAME_SOURCE == "directory":
            readonly.append("unix_username")  # never editable in the portal: the directory says
        return readonly

    def save_model(self, request: HttpRequest, obj: User, form: ModelForm[User], change: bool) -> None:
        if obj.unix_username and obj.unix_username == obj.unix_username_requested:
            obj.unix_username_requested = ""  # the admin typed in what was asked: granted
        super().save_model(request, obj, form, change)

    @admin.action(description="Refuse the requested unix usernames", permissions=["change"])
    def refuse_unix_usernames(self, request: HttpRequest, queryset: QuerySet[User]) -> None:
        from accounts.services import UnixUsernameError, unix_username_refuse

        for user in queryset.exclude(unix_username_requested=""):
            try:
                unix_username_refuse(user=user, actor=request.user, reason="refused in admin")
            except UnixUsernameError as error:
                self.message_user(request, f"{user.get_username()}: {error}", messages.ERROR)
            else:
                self.message_user(request, f"{user.get_username()}: request refused.")


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    """Tokens are created by their owners (profile, API, or create_api_token); admins can see and revoke."""

    list_display = ("user", "name", "prefix", "created_at", "expires_at", "last_used_at", "revoked_at")
    list_filter = (("revoked_at", admin.EmptyFieldListFilter),)
    search_fields = ("user__username", "name", "prefix")
    readonly_fields = ("user", "name", "prefix", "created_at", "expires_at", "last_used_at", "revoked_at")
    exclude = ("key_hash",)
    actions = ["revoke_selected"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    @admin.action(description="Revoke selected tokens", permissions=["change"])
    def revoke_selected(self, request: HttpRequest, queryset: QuerySet[ApiToken]) -> None:
        from accounts.services import api_token_revoke

        for token in queryset.filter(revoked_at=None):
            api_token_revoke(token=token, actor=request.user)
        self.message_user(request, "Revoked.")
