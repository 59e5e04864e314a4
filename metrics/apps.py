from __future__ import annotations

from django.apps import AppConfig


class MetricsConfig(AppConfig):
    name = "metrics"
    verbose_name = "Prometheus metrics"

    def ready(self) -> None:
        from metrics import checks  # noqa: F401  (registers the system checks)
