"""OpenID Connect login (mozilla-django-oidc): accounts are linked on the provider's subject.

- An account is found by its stored subject (``User.oidc_sub``): the ID token's ``sub``, which the
  provider never reassigns and the person cannot edit. The username and email claims are never used
  to find an account: a renamed ``preferred_username`` or a new email at the provider still lands on
  the same account, and claiming somebody else's username lands on nobody's.
- A subject the portal has not seen before gets a new account, named by the ``OIDC_USERNAME_CLAIM``
  claim (default ``preferred_username``). When an account of that name exists already the login is
  refused with a message saying to ask an administrator, who links the account by setting its
  OpenID Connect subject in Django admin (the message and the log name the subject). Only while
  ``OIDC_LINK_BY_USERNAME`` is on (an upgrade aid, off by default) is such an account linked
  automatically, and then only an active one with no subject, no usable password, and not staff or
  superuser. An existing staff account is never linked automatically.
- The userinfo answer must be about the ID token's subject (OpenID Connect Core 5.3.2).
- Email is stored only when the provider says it is verified (``email_verified: true``).
- With UNIX_USERNAME_SOURCE=directory (the default when OIDC is on with ``OIDC_UNIX_USERNAME_CLAIM``
  named), the unix username comes from that claim, which has no default (an editable username claim
  would let people rename themselves into a colleague's node account), and must pass the portal's
  rule (accounts.validators): ``root`` or ``../x`` refuses the login with a message saying why.
- With ``OIDC_STAFF_GROUPS`` set, staff (booking admins) are exactly the members of those groups
  in the ``OIDC_GROUPS_CLAIM`` claim.
- A provider out of reach when the portal exchanges the code (stopped, not answering, answering 5xx) is an
  outage, not a failed login: the login page says so and nothing is counted against the address
  (``PortalOIDCCallbackView``), where the library let the error through as a 500.
"""

from __future__ import annotations

import logging
from typing import Any, NoReturn, cast

from django.conf import settings
from django.contrib import messages
from django.core.exceptions import SuspiciousOperation, ValidationError
from django.db import IntegrityError, transaction
from django.http import HttpRequest, HttpResponse
from mozilla_django_oidc.auth import OIDCAuthenticationBackend
from mozilla_django_oidc.views import OIDCAuthenticationCallbackView
from requests import RequestException

from accounts.models import User
from accounts.sso import check_unix_username, refusal

logger = logging.getLogger(__name__)

# A CharField, so it has a max_length (get_field() is typed for every kind of field).
_SUBJECT_MAX_LENGTH = cast(int, User._meta.get_field("oidc_sub").max_length)


def _verified_email(claims: dict[str, Any]) -> str:
    email = claims.get("email")
    if isinstance(email, str) and email and claims.get("email_verified") is True:
        return email
    return ""


PROVIDER_UNREACHABLE = (
    "The institutional login cannot reach its provider just now. Try again in a few minutes "
    "(an account with a password of the portal's own logs in with the form)."
)


class ProviderUnreachable(Exception):
    """The OpenID provider did not answer the portal's token, userinfo or key request."""


class PortalOIDCBackend(OIDCAuthenticationBackend):
    def authenticate(self, request: HttpRequest | None, **kwargs: Any) -> User | None:
        try:
            return cast("User | None", super().authenticate(request, **kwargs))
        except RequestException as error:
            # Raised, not None: Django would announce a failed login, which the lockouts count.
            logger.warning("the OpenID provider could not be reached: %s", error)
            raise ProviderUnreachable from error

    def verify_claims(self, claims: dict[str, Any]) -> bool:
        return isinstance(claims.get(settings.OIDC_USERNAME_CLAIM), str)

    def get_or_create_user(self, access_token: str, id_token: str, payload: dict[str, Any]) -> User:
        """The account of the ID token's subject (``payload`` is the verified ID token), created or
        linked on its first login; SuspiciousOperation, with a message for the person, refuses."""
        claims = self.get_userinfo(access_token, id_token, payload)
        subject = payload.get("sub")
        if not isinstance(subject, str) or not subject or len(subject) > _SUBJECT_MAX_LENGTH:
            self._refuse(
                "Institutional login refused: the provider sent no usable subject (sub). Ask an administrator."
            )
        if claims.get("sub") != subject:
            self._refuse("Institutional login refused: the provider's answers were about two people. Try again.")
        if not self.verify_claims(claims):
            self._refuse(
                f"Institutional login refused: the provider sent no {settings.OIDC_USERNAME_CLAIM} claim. "
                "Ask an administrator."
            )
        user = User.objects.filter(oidc_sub=subject).first()
        if user is None:
            user = self._first_login(subject, claims)
        return self._save_from_claims(user, claims)

    def update_user(self, user: User, claims: dict[str, Any]) -> User:
        return self._save_from_claims(user, claims)

    def _first_login(self, subject: str, claims: dict[str, Any]) -> User:
        """A new account for a subject seen for the first time, or the one earlier institutional login
        made under its username before subjects were stored (see the module's docstring)."""
        username = claims[settings.OIDC_USERNAME_CLAIM]
        existing = User.objects.filter(username=username).first()
        if existing is None:
            user = User(username=username, oidc_sub=subject)
            user.set_unusable_password()
            return user
        staff = existing.is_staff or existing.is_superuser
        # Off by default: an account with no password and no subject may equally be an LDAP account or
        # one an admin made password-less, and a username claim people can edit would then hand it over.
        # It is an upgrade aid for accounts the username-claim login made before subjects were stored.
        upgrading = settings.OIDC_LINK_BY_USERNAME and existing.is_active
        if upgrading and existing.oidc_sub is None and not existing.has_usable_password() and not staff:
            logger.info("OIDC subject %r linked to the existing account %r on its first login", subject, username)
            existing.oidc_sub = subject
            return existing
        message = (
            f"Institutional login refused for {username!r}: the portal account {username!r} is not linked to "
            f"your institutional identity. Ask an administrator to link it: in Django admin, they set the "
            f"account's OpenID Connect subject to {subject!r}."
        )
        logger.warning(message)
        self._refuse(message)

    def _refuse(self, message: str) -> NoReturn:
        if getattr(self, "request", None) is not None:
            messages.error(self.request, message)
        raise SuspiciousOperation(message)  # the library logs it and refuses the login

    def _save_from_claims(self, user: User, claims: dict[str, Any]) -> User:
        try:
            if user.pk is None:
                User.username_validator(user.username)
                if len(user.username) > User._meta.get_field("username").max_length:
                    raise ValidationError(f"the username {user.username[:20]!r}… is too long.")
            unix_username = claims.get(settings.OIDC_UNIX_USERNAME_CLAIM)
            if unix_username is not None and settings.UNIX_USERNAME_SOURCE == "directory":
                check_unix_username(user, str(unix_username))
                user.unix_username = str(unix_username)
        except ValidationError as error:
            self._refuse(refusal(repr(user.username), error))
        user.first_name = str(claims.get("given_name", user.first_name))[:150]
        user.last_name = str(claims.get("family_name", user.last_name))[:150]
        user.email = _verified_email(claims) or user.email
        if settings.OIDC_STAFF_GROUPS:
            groups = claims.get(settings.OIDC_GROUPS_CLAIM) or []
            user.is_staff = bool(set(settings.OIDC_STAFF_GROUPS) & set(groups))
        try:
            with transaction.atomic():
                user.save()
        except IntegrityError:  # the same subject or username saved by a login running at the same moment
            self._refuse(f"Institutional login for {user.username!r} collided with another one. Try again.")
        return user


class PortalOIDCCallbackView(OIDCAuthenticationCallbackView):
    """The provider's redirect back to the portal (settings.OIDC_CALLBACK_CLASS): with the provider out of reach,
    back to the login page, which says so."""

    def get(self, request: HttpRequest) -> HttpResponse:
        try:
            return cast(HttpResponse, super().get(request))
        except ProviderUnreachable:
            messages.error(request, PROVIDER_UNREACHABLE)
            return cast(HttpResponse, self.login_failure())
