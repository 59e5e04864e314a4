"""Fields and validators shared by the API and the pages, and the one rule for times anyone gives.

The calendar the portal keeps runs from 1970-01-01 to 2999-12-31 (UTC), with offsets a real time
zone can have (-12:00 to +14:00). Python's datetime ends at the years 1 and 9999: a time near either
edge overflows as soon as something adds to it (the 15-minute grid, a week of limits, a report's
default period, a reader's time zone), which answered 500. Keeping every given time a thousand
years inside those edges makes all such arithmetic safe, and no booking, report or filter has a
use for the years outside. The API's fields, the pages' forms and the booking service apply it.
"""

from __future__ import annotations

import re
from datetime import UTC, date, datetime, timedelta
from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from django.utils import timezone
from rest_framework import serializers

EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(3000, 1, 1, tzinfo=UTC)  # exclusive
WESTMOST_OFFSET = timedelta(hours=-12)  # Baker Island
EASTMOST_OFFSET = timedelta(hours=14)  # Kiribati's Line Islands
OUT_OF_RANGE = "{} is outside the dates the portal takes: give a {} from 1970-01-01 to 2999-12-31 (UTC)."
BAD_OFFSET = "The offset {} is no time zone's: offsets run from -12:00 to +14:00, like 2026-12-03T14:00:00+01:00."

# The offset at the end of an ISO 8601 time (after the hour, minutes and seconds), to name one the
# parser refused outright: +99:00, +24:00.
_TRAILING_OFFSET = re.compile(
    r"[T ]\d{2}(?::?\d{2}(?::?\d{2}(?:[.,]\d+)?)?)?\s*"  # the time
    r"(?P<sign>[+-])(?P<hours>\d{2})(?::?(?P<minutes>\d{2}))?(?::?\d{2})?$"  # the offset
)


def _offset_text(offset: timedelta) -> str:
    minutes = round(offset.total_seconds() / 60)
    sign = "-" if minutes < 0 else "+"
    return f"{sign}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"


def moment_problem(value: datetime) -> str | None:
    """Why the aware ``value`` is not a time the portal takes, in words a person can act on; None if it is.

    Comparing aware datetimes never overflows (Python compares them without converting), so this is
    safe on any value the parser produced, before anything converts or adds to it.
    """
    # The dates first: a zone's offsets before 1900 (local mean time) can lie outside today's range.
    if not EARLIEST <= value < LATEST:
        return OUT_OF_RANGE.format(value.replace(microsecond=0).isoformat(), "time")
    offset = value.utcoffset()
    if offset is not None and not WESTMOST_OFFSET <= offset <= EASTMOST_OFFSET:
        return BAD_OFFSET.format(_offset_text(offset))
    return None


def day_problem(value: date) -> str | None:
    """The same rule for a calendar day (pages read a day as local midnight, then add a day)."""
    if not EARLIEST.date() <= value < LATEST.date():
        return OUT_OF_RANGE.format(value.isoformat(), "day")
    return None


def offset_problem(text: str) -> str | None:
    """For a time the parser refused: name its offset when that offset is what is wrong (+99:00)."""
    found = _TRAILING_OFFSET.search(text.strip())
    if found is None:
        return None
    sign, hours, minutes = found["sign"], found["hours"], found["minutes"] or "00"
    offset = timedelta(hours=int(hours), minutes=int(minutes)) * (-1 if sign == "-" else 1)
    if WESTMOST_OFFSET <= offset <= EASTMOST_OFFSET and int(minutes) < 60:
        return None
    return BAD_OFFSET.format(f"{sign}{hours}:{minutes}")


def validate_moment(value: datetime) -> None:
    """A form validator for a date and time (an aware one: Django's forms make them aware)."""
    problem = moment_problem(value) if timezone.is_aware(value) else None
    if problem:
        raise DjangoValidationError(problem, code="out_of_range")


def validate_day(value: date) -> None:
    """A form validator for a calendar day."""
    problem = day_problem(value)
    if problem:
        raise DjangoValidationError(problem, code="out_of_range")


class AwareDateTimeField(serializers.DateTimeField):
    """An ISO 8601 datetime that must carry its offset (a naive time is ambiguous, so it is refused)
    and fall inside the calendar the portal keeps (``moment_problem``)."""

    default_error_messages = {
        "naive": "Give the time zone, as an offset or Z: like 2026-12-03T14:00:00+01:00.",
        # DRF's words when converting to UTC overflows; the range check comes first, so this is a
        # last line only.
        "overflow": OUT_OF_RANGE.format("That time", "time"),
    }

    def to_internal_value(self, value: Any) -> datetime:
        try:
            return super().to_internal_value(value)
        except serializers.ValidationError as refused:
            # Only when the parser gave up ("wrong format") may the offset be what it choked on.
            problem = offset_problem(value) if isinstance(value, str) and refused.get_codes() == ["invalid"] else None
            if problem:
                raise serializers.ValidationError(problem, code="out_of_range") from None
            raise

    def enforce_timezone(self, value: datetime) -> datetime:
        if timezone.is_naive(value):
            self.fail("naive")
        # Before DRF converts the value to UTC, which is where year 9999 with a negative offset overflows.
        problem = moment_problem(value)
        if problem:
            raise serializers.ValidationError(problem, code="out_of_range")
        return super().enforce_timezone(value)
