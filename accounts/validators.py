"""The unix username rule, shared by the portal and (as a copy) the node agent.

The name reaches system calls on the GPU nodes (ACLs, process ownership), so it is checked
strictly, with ``\\Z`` rather than ``$`` so that a trailing newline cannot slip through.
"""

from __future__ import annotations

import re
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django.core.exceptions import ValidationError

UNIX_USERNAME_RE = re.compile(r"\A[a-z_][a-z0-9_-]{0,31}\Z")

# Accounts that must never receive a booked GPU: root and the usual system accounts.
RESERVED_UNIX_USERNAMES = frozenset(
    {
        "root",
        "daemon",
        "bin",
        "sys",
        "sync",
        "games",
        "man",
        "lp",
        "mail",
        "news",
        "uucp",
        "proxy",
        "backup",
        "list",
        "irc",
        "nobody",
        "messagebus",
        "sshd",
        "polkitd",
        "nvidia-persistenced",
    }
)


def validate_unix_username(value: str) -> None:
    if not isinstance(value, str) or not UNIX_USERNAME_RE.match(value):
        raise ValidationError(
            "%(value)r is not a valid unix username: use 1 to 32 characters, lower-case letters, "
            "digits, '_' or '-', starting with a letter or '_'.",
            code="invalid_unix_username",
            params={"value": value},
        )
    if value in RESERVED_UNIX_USERNAMES:
        raise ValidationError(
            "%(value)r is a system account and cannot be given GPUs.",
            code="reserved_unix_username",
            params={"value": value},
        )


def validate_timezone(value: str) -> None:
    """An IANA zone name the server knows (zoneinfo), such as Europe/Berlin or UTC."""
    try:
        ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValidationError(
            f"Unknown time zone {value!r}: use a name like Europe/Berlin or America/New_York."
        ) from None
