"""Celery tasks of alerts: thin adapters over alerts/idle.py and alerts/staff_mail.py, run by beat
(portal/celery.py) and, for staff mail (alerts.mail_staff, in alerts/staff_mail.py), as soon as an alert opens."""

from __future__ import annotations

from celery import shared_task
from django.utils import timezone

from alerts.idle import alerts_check_idle

# The staff mail task lives beside what it sends (it is queued from there too); imported here so
# that the worker registers it.
from alerts.staff_mail import mail_staff  # noqa: F401


@shared_task(name="alerts.check_idle", ignore_result=True)
def check_idle() -> dict[str, list[int]]:
    """Beat, every minute: booked GPUs left idle (the holder told, the booking released if policy says)."""
    run = alerts_check_idle(now=timezone.now())
    return {"opened": run.opened, "resolved": run.resolved, "told": run.holders_told, "released": run.released}
