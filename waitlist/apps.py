from django.apps import AppConfig


class WaitlistConfig(AppConfig):
    name = "waitlist"
    verbose_name = "Waitlist"

    def ready(self) -> None:
        from waitlist import receivers  # noqa: F401  (connects the receivers)
