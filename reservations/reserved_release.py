"""Announcing reserved capacity that released (reservations/reserved.py, docs/booking-rules.md).

An occurrence stops restricting anyone at its release time whatever happens here: the booking rule reads the
clock. This only announces it, once per occurrence, so that what waits for freed time (the waitlist) can take
it: the beat task finds occurrences whose release time has passed and that have not ended, records each in
ReservedRelease (unique per occurrence: two runs at once, or a run after a missed one, announce it once) and
sends ``reserved_capacity_released`` in that transaction, its on-commit phase after it commits.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from reservations.models import ReservedCapacity, ReservedRelease
from reservations.reserved import ReservedOccurrence, occurrences_of, release_hours
from reservations.signals import reserved_capacity_released

logger = logging.getLogger(__name__)


def reserved_release_due(*, now: datetime | None = None) -> int:
    """Announce every occurrence released by ``now`` and not over yet, each once. Returns how many now."""
    now = now or timezone.now()
    announced = 0
    reach = timedelta(days=settings.SERIES_MAX_DAYS + 1)  # a repeating window's span (reservations/recurrence.py)
    windows = ReservedCapacity.objects.filter(Q(end__gt=now) | (~Q(rule="") & Q(start__gt=now - reach)))
    windows = windows.select_related("group", "node")
    for reserved in windows.prefetch_related("gpus"):
        hours = release_hours(reserved)
        if not hours:
            continue
        # Occurrences not over whose start is at most ``hours`` away (one starting exactly then included).
        for occurrence in occurrences_of(reserved, now, now + timedelta(hours=hours, seconds=1)):
            if occurrence.released(now) and not _recorded(occurrence):
                announced += _announce(occurrence, now)
    return announced


def _recorded(occurrence: ReservedOccurrence) -> bool:
    return ReservedRelease.objects.filter(reserved=occurrence.reserved, occurrence_start=occurrence.start).exists()


def _announce(occurrence: ReservedOccurrence, now: datetime) -> int:
    reserved = occurrence.reserved
    try:
        with transaction.atomic():
            try:
                with transaction.atomic():
                    ReservedRelease.objects.create(
                        reserved=reserved, occurrence_start=occurrence.start, released_at=now
                    )
            except IntegrityError:
                return 0  # another run recorded it first: it announces it
            reserved_capacity_released.send(
                sender=ReservedCapacity,
                reserved=reserved,
                node=reserved.node,
                model=reserved.gpu_model,
                gpu_ids=sorted(gpu.pk for gpu in reserved.gpus.all()),
                count=reserved.count,
                start=occurrence.start,
                end=occurrence.end,
            )
    except Exception:
        # A receiver that fails rolls its release record back with it, so the next run announces the occurrence
        # again; the other occurrences are announced meanwhile.
        logger.exception("Announcing the release of reserved capacity #%s at %s failed", reserved.pk, occurrence.start)
        return 0
    return 1
