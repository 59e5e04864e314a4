"""LDAP login (django-auth-ldap): the password form checks the password against the directory,
creates or updates the user from its entry (names and mail through AUTH_LDAP_USER_ATTR_MAP, staff
from LDAP_STAFF_GROUP), and, with UNIX_USERNAME_SOURCE=directory (the default when LDAP is on), takes
the unix username from ``LDAP_UNIX_USERNAME_ATTR`` (default ``uid``), refused unless it passes the
portal's rule (accounts.validators)."""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.dispatch import receiver
from django_auth_ldap.backend import LDAPBackend, populate_user

from accounts.models import User
from accounts.sso import check_unix_username, refusal

logger = logging.getLogger(__name__)


class PortalLDAPBackend(LDAPBackend):
    pass


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
