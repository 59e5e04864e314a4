"""Writing the audit trail. Every service that changes state calls ``audit_record`` once."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.db import models

from audit.models import AuditEntry


def audit_record(
    *,
    actor: Any | None,
    action: str,
    target: models.Model,
    before: Mapping[str, Any] | None = None,
    after: Mapping[str, Any] | None = None,
    reason: str = "",
) -> AuditEntry:
    actor_obj = actor if actor is not None and getattr(actor, "pk", None) else None
    return AuditEntry.objects.create(
        actor=actor_obj,
        actor_name=actor_obj.get_username() if actor_obj else "",
        action=action,
        target_type=target._meta.label_lower,
        target_id=str(target.pk),
        target_repr=str(target)[:200],
        before=before,
        after=after,
        reason=reason,
    )
