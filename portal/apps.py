from django.apps import AppConfig


class PortalConfig(AppConfig):
    """The shell as an app only for its system checks (portal/checks.py): no models, no pages of its own."""

    name = "portal"
    verbose_name = "Portal"

    def ready(self) -> None:
        from portal import checks  # noqa: F401 - registers the system checks
