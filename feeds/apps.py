from django.apps import AppConfig


class FeedsConfig(AppConfig):
    name = "feeds"
    verbose_name = "Calendar feeds"

    def ready(self) -> None:
        # Feed URLs carry a secret: every log line goes through the kernel's redaction (kernel/logs.py).
        from feeds.tokens import redact_feed_urls
        from kernel.logs import register_redactor

        register_redactor(redact_feed_urls)
