"""Celery tasks of alerts: thin adapters over alerts.services, run by beat (portal/celery.py) and,
for staff mail, as soon as an alert opens."""

from __future__ import annotations

from celery import shared_task
from django.utils import timezone

from alerts.services import alerts_check_idle, alerts_mail_staff


@shared_task(name="alerts.mail_staff", ignore_result=True)
def mail_staff() -> int:
    """After an alert opens, and beat every minute: staff mail for alerts not mailed yet (each once,
    within ALERT_MAILS_PER_KIND_PER_HOUR). A failed send gives its alerts back for the next run."""
    return alerts_mail_staff(now=timezone.now())


@shared_task(name="alerts.check_idle", ignore_result=True)
def check_idle() -> dict[str, list[int]]:
    """Beat, every minute: booked GPUs left idle (the holder told, the booking released if policy says)."""
    run = alerts_check_idle(now=timezone.now())
    return {"opened": run.opened, "resolved": run.resolved, "told": run.holders_told, "released": run.released}
