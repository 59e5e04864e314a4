"""OpenID Connect login (mozilla-django-oidc): a user is created or updated from the provider's
claims at each login.

- The portal username is the ``OIDC_USERNAME_CLAIM`` claim (default ``preferred_username``); an
  account with that username is the same person. Failing that, an account whose email matches is,
  but only when the provider says the email is verified (``email_verified: true``): an unverified
  email is never used to match and never stored.
- The unix username comes from ``OIDC_UNIX_USERNAME_CLAIM`` and must pass the portal's rule
  (accounts.validators): ``root`` or ``../x`` refuses the login with a message saying why.
- With ``OIDC_STAFF_GROUPS`` set, staff (booking admins) are exactly the members of those groups
  in the ``OIDC_GROUPS_CLAIM`` claim.
"""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.core.exceptions import SuspiciousOperation, ValidationError
from django.db.models import QuerySet
from mozilla_django_oidc.auth import OIDCAuthenticationBackend

from accounts.models import User
from accounts.sso import check_unix_username, refusal

logger = logging.getLogger(__name__)


def _verified_email(claims: dict[str, Any]) -> str:
    email = claims.get("email")
    if isinstance(email, str) and email and claims.get("email_verified") is True:
        return email
    return ""


class PortalOIDCBackend(OIDCAuthenticationBackend):
    def verify_claims(self, claims: dict[str, Any]) -> bool:
        return isinstance(claims.get(settings.OIDC_USERNAME_CLAIM), str)

    def filter_users_by_claims(self, claims: dict[str, Any]) -> QuerySet[User]:
        users = User.objects.filter(username=claims[settings.OIDC_USERNAME_CLAIM])
        email = _verified_email(claims)
        if users.exists() or not email:
            return users
        return User.objects.filter(email__iexact=email)

    def describe_user_by_claims(self, claims: dict[str, Any]) -> str:
        return f"username {claims.get(settings.OIDC_USERNAME_CLAIM)!r}"

    def create_user(self, claims: dict[str, Any]) -> User:
        user = User(username=claims[settings.OIDC_USERNAME_CLAIM])
        user.set_unusable_password()
        return self._save_from_claims(user, claims)

    def update_user(self, user: User, claims: dict[str, Any]) -> User:
        return self._save_from_claims(user, claims)

    def _save_from_claims(self, user: User, claims: dict[str, Any]) -> User:
        try:
            if user.pk is None:
                User.username_validator(user.username)
                if len(user.username) > User._meta.get_field("username").max_length:
                    raise ValidationError(f"the username {user.username[:20]!r}… is too long.")
            unix_username = claims.get(settings.OIDC_UNIX_USERNAME_CLAIM)
            if unix_username is not None:
                check_unix_username(user, str(unix_username))
                user.unix_username = str(unix_username)
        except ValidationError as error:
            message = refusal(repr(claims.get(settings.OIDC_USERNAME_CLAIM)), error)
            if getattr(self, "request", None) is not None:
                messages.error(self.request, message)
            raise SuspiciousOperation(message) from None  # the library logs it and refuses the login
        user.first_name = str(claims.get("given_name", user.first_name))[:150]
        user.last_name = str(claims.get("family_name", user.last_name))[:150]
        user.email = _verified_email(claims) or user.email
        if settings.OIDC_STAFF_GROUPS:
            groups = claims.get(settings.OIDC_GROUPS_CLAIM) or []
            user.is_staff = bool(set(settings.OIDC_STAFF_GROUPS) & set(groups))
        user.save()
        return user
