"""The life of an Alert row: opened once per subject while the condition lasts, resolved once.

An alert is about a subject (kind, node, GPU, user). The partial unique constraint keeps one open
per subject, so two evaluations at once open it once; resolving is a compare-and-swap per alert, so
whoever resolves it first says how. Every open and resolve is announced after commit
(``alerts.signals.alert_changed``: live shows the new state on the admins' status pages), and a new
alert of a kind staff hear about asks a worker to mail them (alerts/staff_mail.py).

What opens and resolves alerts is in alerts/conditions.py and alerts/idle.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.db.models import QuerySet
from django.utils import timezone

from alerts.models import Alert
from alerts.signals import alert_changed
from alerts.staff_mail import STAFF_MAIL_KINDS, staff_mail_soon
from audit.services import audit_record
from nodes.services import gpu_return_to_service

Kind = Alert.Kind


@dataclass(frozen=True)
class Subject:
    kind: str
    node_id: int | None  # None: the portal itself (periodic jobs late)
    gpu_id: int | None = None
    username: str = ""

    def open_alerts(self) -> QuerySet[Alert]:
        return Alert.objects.filter(
            kind=self.kind, node=self.node_id, gpu=self.gpu_id, username=self.username, resolved_at__isnull=True
        )


def alert_open(
    *, subject: Subject, now: datetime, details: dict[str, Any], reservation_id: int | None = None
) -> Alert | None:
    """Open an alert for ``subject`` unless one is open (then only its last bad moment moves).
    Returns the new alert, or None. The partial unique constraint decides, so two evaluations at
    once open it once."""
    if subject.open_alerts().update(last_bad_at=now):
        return None
    user = get_user_model().objects.filter(unix_username=subject.username).first() if subject.username else None
    try:
        with transaction.atomic():
            alert = Alert.objects.create(
                kind=subject.kind,
                node_id=subject.node_id,
                gpu_id=subject.gpu_id,
                username=subject.username,
                user=user,
                reservation_id=reservation_id,
                opened_at=now,
                last_bad_at=now,
                details=details,
            )
    except IntegrityError:
        subject.open_alerts().update(last_bad_at=now)
        return None
    _announce([alert.pk], mail=alert.kind in STAFF_MAIL_KINDS)
    return alert


def alerts_resolve(alerts: QuerySet[Alert], *, now: datetime, resolution: str, actor: Any | None = None) -> list[int]:
    """Resolve the open alerts among ``alerts``; returns the ids this call resolved."""
    ids = list(alerts.filter(resolved_at__isnull=True).values_list("pk", flat=True))
    if not ids:
        return []
    resolved = []
    for pk in ids:  # a compare-and-swap each: whoever resolves it first says how
        if Alert.objects.filter(pk=pk, resolved_at__isnull=True).update(
            resolved_at=now, resolution=resolution[:200], resolved_by=actor if getattr(actor, "pk", None) else None
        ):
            resolved.append(pk)
    if resolved:
        _announce(resolved, mail=False)
    return resolved


def alert_resolve_by_admin(*, alert: Alert, actor: Any) -> bool:
    """An admin's "resolve": a drained GPU goes back to service (which resolves its alert, audited
    as the GPU's return); anything else is closed as handled. True if this call resolved it."""
    with transaction.atomic():
        gpu = alert.gpu if alert.kind == Kind.UNKILLABLE else None
        if gpu is not None and gpu.drained_at is not None and gpu_return_to_service(gpu=gpu, actor=actor):
            return Alert.objects.filter(pk=alert.pk, resolved_by=actor, resolved_at__isnull=False).exists()
        done = alerts_resolve(
            Alert.objects.filter(pk=alert.pk), now=timezone.now(), resolution="resolved by an admin", actor=actor
        )
        if done:
            audit_record(actor=actor, action="alert.resolve", target=alert, after={"kind": alert.kind})
    return bool(done)


def _announce(alert_ids: list[int], *, mail: bool) -> None:
    """After commit: the alerts' new state to whoever follows them (alert_changed); staff mail for
    new ones."""
    alert_changed.send(sender=Alert, alert_ids=alert_ids)
    if mail:
        staff_mail_soon(alert_ids=alert_ids)
