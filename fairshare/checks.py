"""System checks for the fair-share settings: a half-life of 0 or no default shares would divide by zero in
every factor (and so in every waitlist order and, with the cap on, every booking), so they stop the portal."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, register

# Settings that must be above 0, and what each means (for the message).
POSITIVE = {
    "FAIRSHARE_HALF_LIFE_DAYS": "the days after which an hour of usage counts half",
    "FAIRSHARE_LOOKBACK_HALF_LIVES": "how many half-lives of usage are read",
    "FAIRSHARE_DEFAULT_SHARES": "the shares of a group without its own",
    "FAIRSHARE_HORIZON_CAP_DAYS": "how far ahead a capped person may book",
}


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@register()
def check_fairshare_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    messages: list[CheckMessage] = []
    for name, meaning in POSITIVE.items():
        value = getattr(settings, name)
        if not _is_number(value) or value <= 0:
            messages.append(
                Error(
                    f"{name}={value!r}: {meaning} must be a number above 0.",
                    hint=f"Unset {name} for the default (docs/booking-rules.md, 'Fair share').",
                    id="fairshare.E001",
                )
            )
    weight = settings.FAIRSHARE_USED_WEIGHT
    if not _is_number(weight) or weight < 0:
        messages.append(
            Error(
                f"FAIRSHARE_USED_WEIGHT={weight!r}: what a used GPU-hour adds must be 0 or more.",
                hint="Unset FAIRSHARE_USED_WEIGHT for the default 1.0; 0 counts booked hours only.",
                id="fairshare.E002",
            )
        )
    below = settings.FAIRSHARE_HORIZON_CAP_BELOW
    if not _is_number(below) or not 0 < below <= 1:
        messages.append(
            Error(
                f"FAIRSHARE_HORIZON_CAP_BELOW={below!r}: the factor under which the cap applies is between 0 and 1.",
                hint="Unset FAIRSHARE_HORIZON_CAP_BELOW for the default 0.25.",
                id="fairshare.E003",
            )
        )
    return messages
