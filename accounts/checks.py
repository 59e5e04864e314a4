"""System checks of the accounts settings."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Tags, Warning, register


@register(Tags.security)
def check_unix_username_source(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Directory-sourced unix usernames need a directory that names them."""
    if settings.UNIX_USERNAME_SOURCE != "directory" or settings.LDAP_SERVER_URI:
        return []
    if settings.OIDC_ENABLED and settings.OIDC_UNIX_USERNAME_CLAIM:
        return []
    return [
        Warning(
            "UNIX_USERNAME_SOURCE=directory, but no directory gives unix usernames: nobody gets GPUs.",
            hint="Set LDAP_SERVER_URI, or OIDC_UNIX_USERNAME_CLAIM to a claim people cannot edit (such as uid); "
            "or choose UNIX_USERNAME_SOURCE=request or admin.",
            id="accounts.W001",
        )
    ]
