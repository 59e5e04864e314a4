"""Validators of user fields. The unix username's syntax lives in ``gpubook_agent.usernames``,
shared with the node agent (which imports nothing from Django); which names are refused outright
is a setting (UNIX_USERNAME_DENYLIST)."""

from __future__ import annotations

from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django.conf import settings
from django.core.exceptions import ValidationError

# One rule for both sides: the agent's module is plain Python, so the portal imports it (as it
# does the snapshot signing) rather than keeping a copy.
from gpubook_agent.usernames import UNIX_USERNAME_RE


def validate_unix_username(value: str) -> None:
    if not isinstance(value, str) or not UNIX_USERNAME_RE.match(value):
        raise ValidationError(
            "%(value)r is not a valid unix username: use 1 to 32 characters, lower-case letters, "
            "digits, '_' or '-', starting with a letter or '_'.",
            code="invalid_unix_username",
            params={"value": value},
        )
    if value in settings.UNIX_USERNAME_DENYLIST:
        raise ValidationError(
            "%(value)r is a system or service account and cannot be given GPUs.",
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
