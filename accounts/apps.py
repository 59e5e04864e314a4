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
        from accounts.redaction import redact_login_secrets
        from kernel.logs import register_redactor

        # An OIDC callback's code and state, an API token put in a URL: never in a log line (kernel/logs.py).
        register_redactor(redact_login_secrets)
