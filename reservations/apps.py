from django.apps import AppConfig


class ReservationsConfig(AppConfig):
    name = "reservations"
    verbose_name = "Reservations"

    def ready(self) -> None:
        from reservations import (
            checks,  # noqa: F401 - registers the system checks
            receivers,  # noqa: F401 - reacts to account changes (accounts/signals.py)
        )
