"""LDAP login (django-auth-ldap): the password form checks the password against the directory,
creates or updates the user from its entry (names and mail through AUTH_LDAP_USER_ATTR_MAP, staff
from LDAP_STAFF_GROUP), and, with UNIX_USERNAME_SOURCE=directory (the default when LDAP is on), takes
the unix username from ``LDAP_UNIX_USERNAME_ATTR`` (default ``uid``), refused unless it passes the
portal's rule (accounts.validators).

A directory out of reach (stopped, or not answering) is not a wrong password: the login page (admin's too) says
the directory cannot be reached, answers 503 with Retry-After, and counts no failed login (which would lock people,
and their address with every local admin behind it, out of the portal for the outage). Local accounts log in as
ever: ``DirectoryAwayBackend`` comes after Django's own backend."""

from __future__ import annotations

import logging
from typing import Any

import ldap
from django.conf import settings
from django.contrib.auth.backends import BaseBackend
from django.core.exceptions import ValidationError
from django.dispatch import receiver
from django.http import HttpRequest
from django_auth_ldap.backend import LDAPBackend, ldap_error, populate_user

from accounts.models import User
from accounts.sso import DirectoryUnreachable, check_unix_username, refusal

logger = logging.getLogger(__name__)


class PortalLDAPBackend(LDAPBackend):
    pass


# What python-ldap raises when it cannot reach the directory or it does not answer in time, as opposed to a
# refusal (wrong password, unknown person) or a misconfiguration.
UNREACHABLE = (ldap.SERVER_DOWN, ldap.TIMEOUT, ldap.CONNECT_ERROR)


@receiver(ldap_error, sender=PortalLDAPBackend)
def note_directory_away(
    sender: type, context: str, request: HttpRequest | None, exception: Exception, **kwargs: Any
) -> None:
    """django-auth-ldap logs the error and returns no user; the request remembers why, for ``DirectoryAwayBackend``."""
    if request is not None and isinstance(exception, UNREACHABLE):
        request.directory_unreachable = True  # type: ignore[attr-defined]


class DirectoryAwayBackend(BaseBackend):
    """The last backend: when no other took the login and the directory could not be reached, raise
    DirectoryUnreachable, which both login forms show, the portal's and admin's (accounts/sso.py). Raising, not
    returning None, keeps Django from announcing a failed login, which the lockouts would count."""

    def authenticate(self, request: HttpRequest | None, **credentials: Any) -> None:
        if request is not None and getattr(request, "directory_unreachable", False):
            raise DirectoryUnreachable
        return None


@receiver(populate_user, sender=PortalLDAPBackend)
def never_reactivate(sender: type, user: User, ldap_user: Any, **kwargs: Any) -> None:
    """LDAP_ACTIVE_GROUP may only take ``is_active`` away: django-auth-ldap sets the flag from the
    group at every login, which would let someone an admin deactivated (and whose bookings were
    ended) back in just by logging in while still in the group."""
    if user.pk is not None and not User.objects.filter(pk=user.pk, is_active=True).exists():
        user.is_active = False


@receiver(populate_user, sender=PortalLDAPBackend)
def take_unix_username(sender: type, user: User, ldap_user: Any, **kwargs: Any) -> None:
    if settings.UNIX_USERNAME_SOURCE != "directory":
        return  # an admin sets or confirms it (docs/security.md, "Who sets the unix username")
    values = ldap_user.attrs.get(settings.LDAP_UNIX_USERNAME_ATTR) or []
    if not values:
        return
    try:
        check_unix_username(user, values[0])
    except ValidationError as error:
        message = refusal(repr(user.username), error)
        logger.warning(message)
        raise ldap_user.AuthenticationFailed(message) from None
    user.unix_username = values[0]
