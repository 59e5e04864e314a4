from django.apps import AppConfig


class NotificationsConfig(AppConfig):
    name = "notifications"
    verbose_name = "Notifications"

    def ready(self) -> None:
        from notifications import (
            checks,  # noqa: F401 - registers the system checks
            receivers,  # noqa: F401 - mails booking changes (reservations/signals.py)
        )
