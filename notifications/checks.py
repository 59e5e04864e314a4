"""System checks for the mail settings: a claim shorter than a send would let two senders send one
mail as a matter of course, not only after a crash."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, register

# SMTP takes a few round trips (connect, hello, TLS, auth, mail, data, quit), each up to EMAIL_TIMEOUT.
SMTP_STEPS = 6


@register()
def check_mail_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    slowest = SMTP_STEPS * (settings.EMAIL_TIMEOUT or 10)
    if slowest >= settings.NOTIFY_CLAIM_SECONDS:
        return [
            Error(
                f"NOTIFY_CLAIM_SECONDS is {settings.NOTIFY_CLAIM_SECONDS}, not more than the slowest send "
                f"({SMTP_STEPS} SMTP steps of EMAIL_TIMEOUT={settings.EMAIL_TIMEOUT or 10} s = {slowest} s): a mail "
                "still being sent would be claimed and sent again.",
                hint=f"Set NOTIFY_CLAIM_SECONDS above {slowest} (the default is 300).",
                id="notifications.E001",
            )
        ]
    return []
