"""Fair share: what each group is entitled to (docs/booking-rules.md, "Fair share")."""

from __future__ import annotations

from django.core.validators import MinValueValidator
from django.db import models


class GroupShare(models.Model):
    """A group's shares of the GPUs, compared with its members' use of them. A group without a row has
    FAIRSHARE_DEFAULT_SHARES; people in no group share FAIRSHARE_DEFAULT_SHARES between them too."""

    group = models.OneToOneField("auth.Group", on_delete=models.CASCADE, related_name="fair_share")
    shares = models.PositiveIntegerField(
        validators=[MinValueValidator(1)],
        help_text="Relative to the other groups': a group with 2 is entitled to twice what a group with 1 is.",
    )

    class Meta:
        verbose_name = "group share"
        constraints = [models.CheckConstraint(condition=models.Q(shares__gte=1), name="group_share_positive")]

    def __str__(self) -> str:
        return f"{self.group.name}: {self.shares} share{'s' if self.shares != 1 else ''}"
