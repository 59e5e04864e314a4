"""Celery tasks of the booking domain."""

from __future__ import annotations

from celery import shared_task
from django.utils import timezone

from accounts.models import User
from reservations import services
from reservations.models import Reservation

# The lease pushes live beside what they push; imported here so that the worker registers them.
from reservations.pushes import push_all_leases, push_node_leases  # noqa: F401
from reservations.receivers import DEACTIVATED
from reservations.reserved_release import reserved_release_due
from reservations.series import series_book_due


@shared_task(name="reservations.end_inactive_bookings", ignore_result=True)
def end_inactive_bookings() -> int:
    """Beat: bookings of deactivated accounts that a deactivation's own reaction missed (a write
    that bypassed save(), a crash in between) are ended. Idempotent. Returns how many."""
    users = User.objects.filter(
        is_active=False,
        reservations__status__in=Reservation.LIVE_STATUSES,
        reservations__end__gt=timezone.now(),
    ).distinct()
    return sum(len(services.reservations_end_for_inactive_user(user=user, reason=DEACTIVATED)) for user in users)


@shared_task(name="reservations.book_due_series", ignore_result=True)
def book_due_series() -> int:
    """Beat, daily: every recurring series books the occurrences that came within its owner's reach
    (reservations/series.py, skipping conflicts). Idempotent. Returns how many were booked."""
    return series_book_due()


@shared_task(name="reservations.release_reserved_capacity", ignore_result=True)
def release_reserved_capacity() -> int:
    """Beat, every 5 minutes: occurrences of reserved capacity whose release time has passed are announced,
    each once (reservations/reserved_release.py). Idempotent. Returns how many were announced now."""
    return reserved_release_due()
