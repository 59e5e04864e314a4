from __future__ import annotations

from django.contrib.auth.models import AbstractUser
from django.db import models

from accounts.validators import validate_unix_username


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

    class Meta(AbstractUser.Meta):
        swappable = "AUTH_USER_MODEL"

    @property
    def is_booking_admin(self) -> bool:
        """Admins approve bookings, may book past limits and act on anyone's reservation."""
        return self.is_active and (self.is_staff or self.is_superuser)
