"""Domain errors of the booking service.

Each carries a message a person can act on and the details behind it (which slot, which limit,
which numbers), so the API, the pages and admin can all show the same words. ``code`` is the
machine-readable name the API returns.
"""

from __future__ import annotations

from typing import Any


class BookingError(Exception):
    code = "booking_error"

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details

    def __str__(self) -> str:
        return self.message


class InvalidBooking(BookingError):
    """The request itself is wrong (times, GPUs, purpose): fix it and try again."""

    code = "invalid"


class SlotConflict(BookingError):
    """Another live booking holds part of the slot. ``details["conflicts"]`` lists them."""

    code = "slot_conflict"


class MaintenanceConflict(SlotConflict):
    """The slot falls inside a maintenance window. ``details["windows"]`` lists them."""

    code = "maintenance"


class LimitExceeded(BookingError):
    """A limit refuses the booking. ``details`` has ``limit``, ``used``, ``asked`` and ``allowed``."""

    code = "limit_exceeded"


class NotAllowed(BookingError):
    """The actor may not do this to this reservation."""

    code = "not_allowed"


class InvalidState(BookingError):
    """The reservation is not in a state that allows this (already cancelled, already over...)."""

    code = "invalid_state"


class BookingBusy(BookingError):
    """The GPUs were locked by other bookings for too long; retrying shortly will work."""

    code = "busy"
