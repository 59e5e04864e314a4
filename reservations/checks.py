"""System checks for the booking rules' settings and the site-wide Limit.

A ceiling that is not a positive number would refuse every booking, so it stops the portal. A
portal without a site-wide Limit works (the ceilings bound how far ahead and how long), but its
admins most likely never looked at the limits: the warning says where to set them. It reads the
database, so like Django's own database checks it runs only when asked for one: ``manage.py
migrate`` and ``manage.py check --database default``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.db import DatabaseError

from reservations.limits import CEILING_SETTINGS
from reservations.models import Limit
from reservations.reserved import MAX_RELEASE_HOURS


@register()
def check_ceilings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    messages: list[CheckMessage] = []
    for name in CEILING_SETTINGS.values():
        value = getattr(settings, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            messages.append(
                Error(
                    f"{name}={value!r}: the site ceiling must be a whole number of 1 or more.",
                    hint=f"Unset {name} for the default, or give the number; to lift it for some people, "
                    "set a Limit for them in admin instead.",
                    id="reservations.E001",
                )
            )
    return messages


@register()
def check_reserved_release_hours(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    # Outside these bounds the release time of reserved capacity is meaningless, or overflows in every booking
    # of a node that has some (reservations/reserved.py); admin keeps a window's own hours to the same bounds.
    value = settings.RESERVED_RELEASE_HOURS
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_RELEASE_HOURS:
        return [
            Error(
                f"RESERVED_RELEASE_HOURS={value!r}: give the hours before a reserved window's start from which "
                f"anyone may book it, from 0 (never) to {MAX_RELEASE_HOURS}.",
                hint="Unset RESERVED_RELEASE_HOURS for the default 0 (reserved capacity never releases).",
                id="reservations.E002",
            )
        ]
    return []


@register(Tags.database)
def check_site_limit(
    app_configs: Any = None, databases: Sequence[str] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    messages: list[CheckMessage] = []
    for alias in databases or ():
        try:
            exists = Limit.objects.using(alias).filter(scope=Limit.Scope.SITE).exists()
        except DatabaseError:  # not migrated yet (``migrate`` runs the checks first): nothing to say
            continue
        if not exists:
            messages.append(
                Warning(
                    "No site-wide booking Limit: researchers are bound only by the site ceilings "
                    f"(MAX_DAYS_AHEAD={settings.MAX_DAYS_AHEAD} days ahead, MAX_SLOT_HOURS={settings.MAX_SLOT_HOURS} "
                    "hours a slot), with no cap on GPUs at once or GPU-hours a week.",
                    hint="Add the site default in admin (Reservations → Limits, scope 'Site default'), even with "
                    "empty fields, once you have chosen; or silence reservations.W001.",
                    id="reservations.W001",
                )
            )
    return messages
