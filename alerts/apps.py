from __future__ import annotations

from django.apps import AppConfig


class AlertsConfig(AppConfig):
    name = "alerts"
    verbose_name = "Alerts"

    def ready(self) -> None:
        from celery.signals import task_success

        from alerts import receivers  # noqa: F401 - reacts to node reports and account changes
        from alerts.jobs import on_task_success

        # Every process connects it; only a worker ever sends it.
        task_success.connect(on_task_success, weak=False, dispatch_uid="alerts.jobs.on_task_success")
