"""Reading the audit trail."""

from __future__ import annotations

from collections.abc import Iterable

from django.db import models
from django.db.models import QuerySet

from audit.models import AuditEntry


def audit_trail(*, model: type[models.Model], ids: Iterable[object]) -> QuerySet[AuditEntry]:
    """The entries about these objects of ``model``, oldest first (uses the target index)."""
    return AuditEntry.objects.filter(
        target_type=model._meta.label_lower, target_id__in=[str(pk) for pk in ids]
    ).order_by("created_at", "id")
