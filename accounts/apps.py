from django.apps import AppConfig


class AccountsConfig(AppConfig):
    name = "accounts"
    verbose_name = "Accounts"

    def ready(self) -> None:
        from accounts import (
            checks,  # noqa: F401 - registers the system checks
            schema,  # noqa: F401 - registers the OpenAPI auth extension
            signals,  # noqa: F401 - watches account changes (accounts/signals.py)
        )
