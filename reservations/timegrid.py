"""The booking time grid: slots start and end on multiples of BOOKING_GRID_MINUTES (UTC)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, tzinfo

from django.conf import settings
from django.utils import dateformat, timezone

from kernel.fields import moment_problem
from reservations.exceptions import InvalidBooking


def grid() -> timedelta:
    return timedelta(minutes=settings.BOOKING_GRID_MINUTES)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def floor_to_grid(moment: datetime) -> datetime:
    # timedelta arithmetic is exact to the microsecond; floats would not be.
    return (moment - (moment - _EPOCH) % grid()).astimezone(UTC)


def ceil_to_grid(moment: datetime) -> datetime:
    floored = floor_to_grid(moment)
    return floored if floored == moment else floored + grid()


def require_in_calendar(moment: datetime, field: str) -> None:
    """Refuse an aware time outside the dates the portal takes (kernel.fields.moment_problem) as an
    invalid booking naming ``field``: the grid, the limits and every message about the slot add to
    it or show it in a reader's zone, which would overflow near the years 1 and 9999."""
    problem = moment_problem(moment)
    if problem:
        raise InvalidBooking(f"{field.capitalize()}: {problem[0].lower()}{problem[1:]}", field=field)


# Messages name times in the zone of whoever reads them: the middleware activates the user's zone
# for pages; API calls with a token (authenticated after the middleware) read UTC.


def format_moment(moment: datetime) -> str:
    local = timezone.localtime(moment)
    return f"{local:%Y-%m-%d %H:%M} {local.tzname()}"


def format_day_time(moment: datetime, zone: tzinfo | None = None, *, abbreviation: bool = False) -> str:
    """'Mon 7 Jan 2030, 09:00' in ``zone`` (default: the current one), as pages and feed texts
    write a time; ``abbreviation`` adds the zone's ('… 09:00 CET')."""
    local = timezone.localtime(moment, zone)
    return dateformat.format(local, "D j M Y, H:i T" if abbreviation else "D j M Y, H:i")


def format_period(start: datetime, end: datetime) -> str:
    local_start, local_end = timezone.localtime(start), timezone.localtime(end)
    if local_start.date() == local_end.date() and local_start.tzname() == local_end.tzname():
        return f"{local_start:%Y-%m-%d %H:%M}–{local_end:%H:%M} {local_end.tzname()}"
    return f"{local_start:%Y-%m-%d %H:%M} {local_start.tzname()} – {local_end:%Y-%m-%d %H:%M} {local_end.tzname()}"


def hours(delta: timedelta) -> float:
    return delta.total_seconds() / 3600


def format_hours(value: float) -> str:
    """38.0 -> '38', 2.25 -> '2.25', 8502660.0 -> '8502660' (never '8.50266e+06')."""
    return f"{value:.2f}".rstrip("0").rstrip(".")
