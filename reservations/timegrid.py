"""The booking time grid: slots start and end on multiples of BOOKING_GRID_MINUTES (UTC)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from django.conf import settings


def grid() -> timedelta:
    return timedelta(minutes=settings.BOOKING_GRID_MINUTES)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def floor_to_grid(moment: datetime) -> datetime:
    # timedelta arithmetic is exact to the microsecond; floats would not be.
    return (moment - (moment - _EPOCH) % grid()).astimezone(UTC)


def ceil_to_grid(moment: datetime) -> datetime:
    floored = floor_to_grid(moment)
    return floored if floored == moment else floored + grid()


def format_moment(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")


def format_period(start: datetime, end: datetime) -> str:
    start_utc, end_utc = start.astimezone(UTC), end.astimezone(UTC)
    if start_utc.date() == end_utc.date():
        return f"{start_utc:%Y-%m-%d %H:%M}–{end_utc:%H:%M} UTC"
    return f"{start_utc:%Y-%m-%d %H:%M} – {end_utc:%Y-%m-%d %H:%M} UTC"


def hours(delta: timedelta) -> float:
    return delta.total_seconds() / 3600


def format_hours(value: float) -> str:
    """38.0 -> '38', 2.25 -> '2.25'."""
    return f"{round(value, 2):g}"
