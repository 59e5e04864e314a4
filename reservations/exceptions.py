"""Domain errors of the booking service.

Each carries a message a person can act on and the details behind it (which slot, which limit,
which numbers), so the API, the pages and admin can all show the same words. ``code`` is the
machine-readable name the API returns.
"""

from __future__ import annotations

from rest_framework import status

from kernel.api import DomainError


class BookingError(DomainError):
    """``http_status`` is what the API answers (kernel/api.py's exception handler)."""

    code = "booking_error"


class InvalidBooking(BookingError):
    """The request itself is wrong (times, GPUs, purpose): fix it and try again."""

    code = "invalid"
    http_status = status.HTTP_400_BAD_REQUEST


class SlotConflict(BookingError):
    """Another live booking holds part of the slot. ``details["conflicts"]`` lists them."""

    code = "slot_conflict"
    http_status = status.HTTP_409_CONFLICT


class MaintenanceConflict(SlotConflict):
    """The slot falls inside a maintenance window. ``details["windows"]`` lists them."""

    code = "maintenance"


class ReservedConflict(SlotConflict):
    """The slot is inside capacity reserved for a group the booker is not in (reservations/reserved.py).
    ``details["reserved"]`` names the window: its group, node, GPUs or count, and the occurrence."""

    code = "reserved"


class LimitExceeded(BookingError):
    """A limit refuses the booking. ``details`` has ``limit``, ``used``, ``asked`` and ``allowed``."""

    code = "limit_exceeded"
    http_status = status.HTTP_403_FORBIDDEN


class NotAllowed(BookingError):
    """The actor may not do this to this reservation."""

    code = "not_allowed"
    http_status = status.HTTP_403_FORBIDDEN


class InvalidState(BookingError):
    """The reservation is not in a state that allows this (already cancelled, already over...)."""

    code = "invalid_state"
    http_status = status.HTTP_409_CONFLICT


class BookingBusy(BookingError):
    """The GPUs were locked by other bookings for too long; retrying shortly will work."""

    code = "busy"
    http_status = status.HTTP_503_SERVICE_UNAVAILABLE
    retry_after = "2"
