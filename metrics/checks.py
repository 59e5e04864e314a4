"""System checks for the /metrics settings: a bad entry is reported when the portal starts, not
discovered by a scrape that is refused."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning, register

from metrics.access import parse_network

SHORT_TOKEN = 16


@register()
def check_metrics_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    messages: list[CheckMessage] = []
    for entry in settings.METRICS_ALLOWED_IPS:
        if parse_network(entry) is None:
            messages.append(
                Error(
                    f"METRICS_ALLOWED_IPS has {entry!r}, which is not an IP address or network.",
                    hint="Use addresses or CIDRs separated by commas, e.g. 10.0.5.7,192.168.10.0/24,fd00::/8.",
                    id="metrics.E001",
                )
            )
    if settings.METRICS_TOKEN and len(settings.METRICS_TOKEN) < SHORT_TOKEN:
        messages.append(
            Warning(
                f"METRICS_TOKEN is {len(settings.METRICS_TOKEN)} characters long: easy to guess.",
                hint="Use a random one of 32 characters or more, e.g. `python3 -c 'import secrets; "
                "print(secrets.token_urlsafe(32))'`.",
                id="metrics.W001",
            )
        )
    return messages
