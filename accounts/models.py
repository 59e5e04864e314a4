from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django.contrib.auth.models import AbstractUser
from django.db import models

from accounts.validators import validate_timezone, validate_unix_username


class User(AbstractUser):
    """A portal user. ``unix_username`` is the account that receives GPUs on the nodes."""

    unix_username = models.CharField(
        max_length=32,
        unique=True,
        null=True,
        blank=True,
        validators=[validate_unix_username],
        help_text="The account on the GPU nodes that gets access to booked GPUs.",
    )
    # Where the unix username comes from is UNIX_USERNAME_SOURCE (docs/security.md). With "request",
    # a researcher proposes one here and it takes effect only once an admin confirms it.
    unix_username_requested = models.CharField(
        "requested unix username",
        max_length=32,
        blank=True,
        validators=[validate_unix_username],
        help_text="Proposed by the researcher; nothing is granted until an admin confirms it.",
    )
    # The OpenID Connect subject (issuer-unique, never reassigned): institutional login links on it
    # rather than on a username or email claim a person may be able to edit at the provider.
    oidc_sub = models.CharField("OpenID Connect subject", max_length=255, unique=True, null=True, blank=True)
    timezone = models.CharField(
        max_length=64,
        default="UTC",
        validators=[validate_timezone],
        help_text="Times on every page and in emails are shown in this zone, e.g. Europe/Berlin.",
    )
    remind_before_end_minutes = models.PositiveSmallIntegerField(
        default=15, help_text="Email this many minutes before a slot ends (0: no reminder)."
    )

    class Meta(AbstractUser.Meta):
        swappable = "AUTH_USER_MODEL"

    @property
    def zone(self) -> ZoneInfo:
        """The zone pages, mails and feeds show this user's times in: UTC when the stored name is
        not (or no longer) a known zone."""
        try:
            return ZoneInfo(self.timezone or "UTC")
        except (ZoneInfoNotFoundError, ValueError):
            return ZoneInfo("UTC")

    @property
    def is_booking_admin(self) -> bool:
        """Admins approve bookings, may book past limits and act on anyone's reservation."""
        return self.is_active and (self.is_staff or self.is_superuser)


class ApiToken(models.Model):
    """A personal API token for scripts. Only a SHA-256 of the token is stored; it is shown once."""

    user = models.ForeignKey(User, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100)
    # The first characters of the token, kept in clear so a person can tell their tokens apart.
    prefix = models.CharField(max_length=16)
    key_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        verbose_name = "API token"

    def __str__(self) -> str:
        return f"{self.user.get_username()}: {self.name} ({self.prefix}…)"

    def state(self, now: datetime) -> str:
        """The token at ``now``: "revoked", "expired" or "active" (the only state that lets it in)."""
        if self.revoked_at is not None:
            return "revoked"
        if self.expires_at is not None and self.expires_at <= now:
            return "expired"
        return "active"
