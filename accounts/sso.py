"""Institutional login, optional (docs/security.md): LDAP through django-auth-ldap
(accounts/sso_ldap.py) or OpenID Connect through mozilla-django-oidc (accounts/sso_oidc.py).

Neither package is installed unless asked (``pip install '.[sso]'``) and settings add a backend only
when its environment is set, so this module imports neither: it holds what both share.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.auth import views as auth_views
from django.core.exceptions import ValidationError
from django.urls import reverse

from accounts.models import User
from accounts.validators import validate_unix_username


def check_unix_username(user: User, value: str) -> None:
    """The unix username a directory gives ``user``: the portal's rule, and nobody else's already.
    Raises ValidationError with a message a person can act on."""
    validate_unix_username(value)
    if User.objects.filter(unix_username=value).exclude(pk=user.pk).exists():
        raise ValidationError(f"{value!r} is already the unix username of another portal account.")


def refusal(user_label: str, error: ValidationError) -> str:
    return f"Institutional login refused for {user_label}: {' '.join(error.messages)} Ask an administrator."


class LoginView(auth_views.LoginView):
    """The password form, plus an "institutional login" button when OpenID Connect is configured.
    (LDAP accounts use the password form itself.)"""

    redirect_authenticated_user = True

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        if settings.OIDC_ENABLED:
            context["sso_login_url"] = reverse("oidc_authentication_init")
            context["sso_login_label"] = settings.OIDC_LOGIN_LABEL
        return context
