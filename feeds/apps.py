from django.apps import AppConfig


class FeedsConfig(AppConfig):
    name = "feeds"
    verbose_name = "Calendar feeds"

    def ready(self) -> None:
        # Feed URLs carry a secret: every log line goes through the kernel's redaction (kernel/logs.py).
        from feeds.tokens import redact_feed_urls
        from kernel.logs import register_redactor

        register_redactor(redact_feed_urls)

        # The profile page (accounts, below us) shows each person's feeds as a part it does not import.
        from accounts.profile_parts import profile_parts
        from feeds.pages import profile_section
        from kernel.page_parts import Part

        profile_parts.register(
            Part(
                name="feeds",
                title="Calendar feeds",
                template="feeds/profile_section.html",
                read=profile_section,
                stylesheets=("css/feeds.css",),
                scripts=("js/feeds.js",),
            )
        )
