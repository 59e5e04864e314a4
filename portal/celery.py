"""The Celery application. Periodic schedules are listed here, in one place."""

from __future__ import annotations

import os

from celery import Celery
from django.conf import settings

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")

app = Celery("portal")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

# Every periodic job, in one place. Each is idempotent and catches up after downtime.
app.conf.beat_schedule = {
    # Level-triggered leases: every node gets its whole state again, repairing any lost push.
    "push-all-leases": {"task": "nodes.push_all_leases", "schedule": 60.0, "options": {"expires": 55}},
    # Mail that is due: slots starting, ending soon, ended (each mail at most once, see
    # notifications/services.py); it catches up after downtime.
    "send-due-mail": {
        "task": "notifications.send_due",
        "schedule": float(settings.NOTIFY_SCAN_SECONDS),
        "options": {"expires": settings.NOTIFY_SCAN_SECONDS},
    },
    # Usage per hour for good, attributed to bookings (recomputes whole hours: idempotent).
    "rollup-usage": {
        "task": "accounting.rollup_usage",
        "schedule": float(settings.USAGE_ROLLUP_SECONDS),
        "options": {"expires": settings.USAGE_ROLLUP_SECONDS},
    },
    # Per-minute telemetry past its keeping time goes (idempotent: a delete by age).
    "prune-usage": {"task": "nodes.prune_usage", "schedule": 3600.0, "options": {"expires": 3000}},
    # Status pages: silent agents' nodes turn offline; slot and maintenance boundaries re-sent.
    "refresh-status": {
        "task": "nodes.refresh_status",
        "schedule": float(settings.STATUS_REFRESH_SECONDS),
        "options": {"expires": settings.STATUS_REFRESH_SECONDS},
    },
    # Alerts (alerts/): staff mail not sent yet (each alert once, rate-limited per kind per hour;
    # also queued when an alert opens), and booked GPUs left idle (holder told, auto-release).
    "alert-mail": {"task": "alerts.mail_staff", "schedule": 60.0, "options": {"expires": 55}},
    "idle-gpus": {"task": "alerts.check_idle", "schedule": 60.0, "options": {"expires": 55}},
}
