"""Institutional login, optional (docs/security.md): LDAP through django-auth-ldap
(accounts/sso_ldap.py) or OpenID Connect through mozilla-django-oidc (accounts/sso_oidc.py).

Neither package is installed unless asked (``pip install '.[sso]'``) and settings add a backend only
when its environment is set, so this module imports neither: it holds what both share.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth import views as auth_views
from django.contrib.auth.forms import AuthenticationForm
from django.core.exceptions import ValidationError
from django.http import HttpRequest
from django.urls import reverse
from django.utils import timezone

from accounts.models import User
from accounts.throttling import login_lockout
from accounts.validators import validate_unix_username


class DirectoryUnreachable(Exception):
    """The login's directory (LDAP) could not be reached: an outage, not a wrong password (accounts/sso_ldap.py)."""

    message = "The directory that checks passwords cannot be reached just now. Try again in a few minutes."
    retry_after_seconds = 60


def check_unix_username(user: User, value: str) -> None:
    """The unix username a directory gives ``user``: the portal's rule, and nobody else's already.
    Raises ValidationError with a message a person can act on."""
    validate_unix_username(value)
    if User.objects.filter(unix_username=value).exclude(pk=user.pk).exists():
        raise ValidationError(f"{value!r} is already the unix username of another portal account.")


def refusal(user_label: str, error: ValidationError) -> str:
    return f"Institutional login refused for {user_label}: {' '.join(error.messages)} Ask an administrator."


class _SaysWhenTheDirectoryIsAway(AuthenticationForm):
    """What every login form of the portal shares (its own, LoginForm, and Django admin's, AdminLoginForm): a
    directory out of reach (DirectoryAwayBackend raises DirectoryUnreachable) is said as such, never a 500 nor a
    wrong password; DirectoryAwayMiddleware answers it with 503 and Retry-After."""

    def clean(self) -> dict[str, Any]:
        try:
            return super().clean()
        except DirectoryUnreachable:
            self.request.directory_unreachable_shown = True  # type: ignore[union-attr]
            raise ValidationError(DirectoryUnreachable.message, code="directory_unreachable") from None


class LoginForm(_SaysWhenTheDirectoryIsAway):
    """Django's login form, saying so when a lockout refused the attempt (accounts/throttling.py) and
    until when, in place of "do not match"."""

    error_messages = {
        **AuthenticationForm.error_messages,
        "invalid_login": "That username and password do not match. Try again.",
    }

    def clean(self) -> dict[str, Any]:
        try:
            return super().clean()
        except ValidationError:
            if not getattr(self.request, "axes_locked_out", False):
                raise
            # The middleware answers 429 with this page (and Retry-After) rather than a page of its own.
            self.request.login_lockout_shown = True  # type: ignore[union-attr]
            message = login_lockout(self.request).message(timezone.now())  # type: ignore[arg-type]
            raise ValidationError(message, code="locked_out") from None


class AdminLoginForm(_SaysWhenTheDirectoryIsAway, AdminAuthenticationForm):
    """Django admin's login form (admin.site.login_form, portal/urls.py): staff only, as Django's, and a directory
    out of reach said as on the portal's own login page. A lockout there keeps its page of its own
    (accounts.throttling.lockout_response)."""


class DirectoryAwayMiddleware:
    """Answers a login the directory could not check (a form above said so) with 503 and Retry-After, whichever
    login page it was: an outage, which a client may retry, not a refusal."""

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> Any:
        response = self.get_response(request)
        if getattr(request, "directory_unreachable_shown", False):
            response.status_code = 503
            response["Retry-After"] = str(DirectoryUnreachable.retry_after_seconds)
        return response


class LoginView(auth_views.LoginView):
    """The password form, plus an "institutional login" button when OpenID Connect is configured.
    (LDAP accounts use the password form itself.)"""

    authentication_form = LoginForm
    redirect_authenticated_user = True

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        if settings.OIDC_ENABLED:
            context["sso_login_url"] = reverse("oidc_authentication_init")
            context["sso_login_label"] = settings.OIDC_LOGIN_LABEL
        return context
