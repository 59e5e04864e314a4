"""The Celery application. Periodic schedules are listed here, in one place."""

from __future__ import annotations

import os

from celery import Celery
from django.conf import settings

from alerts.jobs import tag_schedule

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")

app = Celery("portal")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

# Every periodic job, in one place. Each is idempotent and catches up after downtime.
app.conf.beat_schedule = {
    # Level-triggered leases: every node gets its whole state again, repairing any lost push.
    "push-all-leases": {"task": "nodes.push_all_leases", "schedule": 60.0, "options": {"expires": 55}},
    # The nodes' broker users (Redis ACL users) again from their stored hashes, should Redis have restarted
    # without them (nodes/broker_users.py): idempotent, and a no-op when every user is as it should be.
    "sync-broker-users": {"task": "nodes.sync_broker_users", "schedule": 60.0, "options": {"expires": 55}},
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
    # Bookings of deactivated accounts that the deactivation's own reaction missed are ended (their
    # leases stopped at once anyway: reservations.leases leaves inactive users out).
    "end-inactive-bookings": {
        "task": "reservations.end_inactive_bookings",
        "schedule": 300.0,
        "options": {"expires": 290},
    },
    # The waitlist (waitlist/): unclaimed offers lapse and pass on, windows that passed expire, and offers
    # whose after-commit step was lost are settled.
    "waitlist-sweep": {"task": "waitlist.sweep", "schedule": 60.0, "options": {"expires": 55}},
    # Recurring bookings: occurrences that came within their owner's days-ahead limit are booked
    # (reservations/series.py; idempotent, conflicts skipped and shown on the series page).
    "book-due-series": {"task": "reservations.book_due_series", "schedule": 86400.0, "options": {"expires": 3600}},
    # Reserved capacity whose release time passed is announced once per occurrence, so that the waitlist can
    # offer the freed time (reservations/reserved_release.py; idempotent: one ReservedRelease row each).
    "release-reserved-capacity": {
        "task": "reservations.release_reserved_capacity",
        "schedule": 300.0,
        "options": {"expires": 290},
    },
    # Launches whose booking ended and whose node never said how they ended are closed (environments/services.py;
    # idempotent: the node ends them at the slot's end anyway).
    "close-overdue-launches": {
        "task": "environments.close_overdue_launches",
        "schedule": 300.0,
        "options": {"expires": 290},
    },
    # Slurm clusters: the portal's advance reservations follow its bookings (slurm/reconcile.py; idempotent, and
    # a controller out of reach changes nothing).
    "slurm-reconcile": {"task": "slurm.reconcile", "schedule": 60.0, "options": {"expires": 55}},
    # ... and their nodes follow the cluster's (new ones, GPU counts, drained or down shown in maintenance).
    "slurm-sync-nodes": {"task": "slurm.sync_nodes", "schedule": 300.0, "options": {"expires": 290}},
    # ... and the usage of its bookings, from the jobs in their reservations where its accounting is on.
    "slurm-read-jobs": {"task": "slurm.read_jobs", "schedule": 600.0, "options": {"expires": 590}},
    # Agent events past NODE_EVENTS_KEEP_DAYS go (idempotent: deletes by age, in batches).
    "prune-node-events": {"task": "nodes.prune_events", "schedule": 3600.0, "options": {"expires": 3000}},
}
# Every run beat starts names its entry, and the worker records each success (alerts/jobs.py): a
# job late by more than three periods opens an alert. Entries added above are watched as they are.
tag_schedule(app.conf.beat_schedule)
