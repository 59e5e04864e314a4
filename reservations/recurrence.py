"""Recurrence rules (RFC 5545 RRULE, via python-dateutil) expanded into occurrences in a time zone.

A series repeats a *wall-clock* time: "every weekday 09:00–13:00 in Europe/Berlin" is 09:00–13:00 on the
clocks in Berlin in January and in June, so 08:00–12:00 UTC in winter and 07:00–11:00 UTC in summer. The
rule is expanded on naive local times; each occurrence's start and end (start + duration, added as wall
time) are then made aware in the zone. Where daylight saving time makes a wall time odd, Python's
``zoneinfo`` with ``fold=0`` decides, and that is the documented rule (docs/booking-rules.md):

- a wall time that does not exist (the hour skipped in spring) is shifted forward by the gap
  (02:30 on the night clocks jump from 02:00 to 03:00 becomes 03:30);
- a wall time that happens twice (the hour repeated in autumn) is the first of the two (summer time);
- an occurrence whose start the gap pushes onto its end keeps its duration (02:30–03:30 becomes 03:30–04:30);
- a series whose occurrences these shifts make overlap (03:00 daily for 23:30 ends at 02:30, so 03:30 on the
  night of the spring change, after the next one's 03:00) is refused when created or edited, naming the days.

Otherwise the end is the wall time start + duration, so an occurrence spanning the change lasts an hour
less (spring) or more (autumn) than usual.

The rules accepted are bounded and at most daily: UNTIL or COUNT is required, the occurrences are capped
(settings.SERIES_MAX_OCCURRENCES) and must fall within settings.SERIES_MAX_DAYS of the first day, and
HOURLY/MINUTELY/SECONDLY rules or BYHOUR/BYMINUTE/BYSECOND parts are refused. At most one occurrence a
day is what lets the local day name an occurrence (Reservation.series_day). Refusals are
InvalidBooking errors (400) whose message says what to change.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from itertools import islice, pairwise
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from dateutil.rrule import DAILY, MONTHLY, WEEKLY, YEARLY, rrule, rrulestr
from django.conf import settings

from reservations.exceptions import InvalidBooking

_ALLOWED_FREQ = {"DAILY": DAILY, "WEEKLY": WEEKLY, "MONTHLY": MONTHLY, "YEARLY": YEARLY}
_SUB_DAILY = {"HOURLY", "MINUTELY", "SECONDLY"}
_SUB_DAILY_PARTS = {"BYHOUR", "BYMINUTE", "BYSECOND"}
_KNOWN_PARTS = {
    "FREQ",
    "UNTIL",
    "COUNT",
    "INTERVAL",
    "BYDAY",
    "BYMONTHDAY",
    "BYYEARDAY",
    "BYWEEKNO",
    "BYMONTH",
    "BYSETPOS",
    "WKST",
}
_DATE_ONLY = re.compile(r"\A\d{8}\Z")
_LOCAL_DATETIME = re.compile(r"\A\d{8}T\d{6}\Z")
_UTC_DATETIME = re.compile(r"\A\d{8}T\d{6}Z\Z")


@dataclass(frozen=True)
class Occurrence:
    """One occurrence: its local day (the series' name for it), its aware start and end, and a note when
    daylight saving time moved it off the wall time asked for."""

    day: date
    start: datetime
    end: datetime
    note: str = ""


def series_zone(name: object) -> ZoneInfo:
    """The IANA zone ``name`` (e.g. Europe/Berlin), or a 400 saying it is unknown."""
    if not isinstance(name, str) or not name.strip():
        raise InvalidBooking("Give the time zone the series repeats in, e.g. Europe/Berlin.", field="timezone")
    try:
        return ZoneInfo(name.strip())
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidBooking(
            f"Unknown time zone {name!r}: use an IANA name such as Europe/Berlin or America/New_York.",
            field="timezone",
        ) from None


def normalise_rule(text: object) -> str:
    """The rule as stored: upper case, without an ``RRULE:`` prefix, its parts checked. Raises InvalidBooking."""
    if not isinstance(text, str) or not text.strip():
        raise InvalidBooking(
            'Give a repeat rule, e.g. "FREQ=WEEKLY;BYDAY=MO,TU,WE,TH,FR;UNTIL=20270331".', field="repeat"
        )
    rule = text.strip().upper()
    if rule.startswith("RRULE:"):
        rule = rule[len("RRULE:") :]
    if "\n" in rule or "DTSTART" in rule:
        raise InvalidBooking(
            "Give only the RRULE (FREQ=...;...): the series starts at the first occurrence's start.", field="repeat"
        )
    parts = _parts(rule)
    freq = parts.get("FREQ")
    if freq is None:
        raise InvalidBooking("The repeat rule needs FREQ (DAILY, WEEKLY, MONTHLY or YEARLY).", field="repeat")
    if freq in _SUB_DAILY:
        raise InvalidBooking(
            f"FREQ={freq} repeats more than once a day: a series repeats at most daily (DAILY, WEEKLY, MONTHLY, "
            "YEARLY). Book one longer slot instead.",
            field="repeat",
        )
    if freq not in _ALLOWED_FREQ:
        raise InvalidBooking(f"Unknown FREQ={freq}: use DAILY, WEEKLY, MONTHLY or YEARLY.", field="repeat")
    sub_daily = sorted(_SUB_DAILY_PARTS & parts.keys())
    if sub_daily:
        raise InvalidBooking(
            f"{', '.join(sub_daily)} would repeat within a day: the time of day is the first occurrence's.",
            field="repeat",
        )
    if "UNTIL" not in parts and "COUNT" not in parts:
        raise InvalidBooking(
            "The repeat rule must end: add UNTIL=YYYYMMDD (the last day) or COUNT=N (how many occurrences).",
            field="repeat",
        )
    if "UNTIL" in parts and "COUNT" in parts:
        raise InvalidBooking("Give UNTIL or COUNT, not both.", field="repeat")
    until = parts.get("UNTIL")
    if until is not None and not (
        _DATE_ONLY.match(until) or _LOCAL_DATETIME.match(until) or _UTC_DATETIME.match(until)
    ):
        raise InvalidBooking(
            f"UNTIL={until} is not a date: write UNTIL=YYYYMMDD (e.g. 20270331) or YYYYMMDDTHHMMSSZ.", field="repeat"
        )
    count = parts.get("COUNT")
    if count is not None and (not count.isdigit() or int(count) < 1):
        raise InvalidBooking(f"COUNT={count} must be a whole number of occurrences, 1 or more.", field="repeat")
    return rule


def expand(
    *, rule: str, zone: ZoneInfo, first_day: date, start_time: time, duration: timedelta, strict: bool = False
) -> list[Occurrence]:
    """The occurrences of ``rule`` (normalised) from ``first_day`` at ``start_time`` wall time in ``zone``,
    each lasting ``duration`` of wall time. Raises InvalidBooking for rules that cannot be booked; ``strict``
    (a series being created or edited) also for occurrences that DST shifts make overlap. A rule stored
    before that check is expanded as it is: its overlapping occurrence is refused when booked."""
    if duration <= timedelta(0):
        raise InvalidBooking("The end must be after the start.", field="end")
    dtstart = datetime.combine(first_day, start_time)
    parts = _parts(rule)
    most = settings.SERIES_MAX_OCCURRENCES
    last_allowed = dtstart + timedelta(days=settings.SERIES_MAX_DAYS)
    count = int(parts["COUNT"]) if "COUNT" in parts else None
    if count is not None and count > most:
        raise _too_many(most)
    until = _until(parts["UNTIL"], zone) if "UNTIL" in parts else None
    if until is not None and until < dtstart:
        raise InvalidBooking(f"UNTIL={parts['UNTIL']} is before the first occurrence ({first_day}).", field="repeat")
    # Expanded up to the span allowed only (never to year 9999 looking for a COUNT that an impossible
    # rule never reaches), COUNT then taken by hand: dateutil refuses UNTIL and COUNT together.
    bounded = _without(rule, "COUNT", "UNTIL") + f";UNTIL={last_allowed:%Y%m%dT%H%M%S}"
    try:
        recurrence = rrulestr(bounded, dtstart=dtstart)
    except (ValueError, TypeError) as exc:
        raise InvalidBooking(f"The repeat rule is not valid RFC 5545: {exc}.", field="repeat") from None
    assert isinstance(recurrence, rrule)
    wanted = count if count is not None else most + 1
    local_starts = [moment for moment in islice(recurrence, wanted + 1) if until is None or moment <= until]
    if count is not None and len(local_starts) < count:
        raise InvalidBooking(
            f"COUNT={count} occurrences reach further than {settings.SERIES_MAX_DAYS} days from the first day: "
            "ask for fewer, or book another series later.",
            field="repeat",
        )
    if until is not None and until > last_allowed and len(local_starts) <= most:
        raise InvalidBooking(
            f"UNTIL={parts['UNTIL']} is more than {settings.SERIES_MAX_DAYS} days after the first day: end the "
            "series sooner, and book another one later.",
            field="repeat",
        )
    local_starts = local_starts[:wanted]
    if len(local_starts) > most:
        raise _too_many(most)
    if not local_starts:
        raise InvalidBooking(
            f"The repeat rule has no occurrence from {first_day} on: check BYDAY/BYMONTHDAY and UNTIL.",
            field="repeat",
        )
    if len(local_starts) > 1:
        closest = min(later - earlier for earlier, later in pairwise(local_starts))
        if duration > closest:
            raise InvalidBooking(
                f"Each occurrence lasts longer than the gap to the next ({_describe(closest)}): occurrences of a "
                "series must not overlap.",
                field="end",
            )
    occurrences = [_occurrence(moment, duration, zone) for moment in local_starts]
    for earlier, later in pairwise(occurrences if strict else ()):
        # Checked again on real time: an end pushed forward by the spring gap can pass the next start.
        if later.start < earlier.end:
            raise InvalidBooking(
                f"The clocks change in {zone.key} between {earlier.day} and {later.day}: the occurrence of "
                f"{earlier.day} would end ({earlier.end.astimezone(zone):%H:%M %Z}) after the next one starts "
                f"({later.start.astimezone(zone):%H:%M %Z}). Shorten the duration or move the start time.",
                field="end",
            )
    return occurrences


def _occurrence(local_start: datetime, duration: timedelta, zone: ZoneInfo) -> Occurrence:
    local_end = local_start + duration
    start, end = _aware(local_start, zone), _aware(local_end, zone)
    notes = [note for note in (_dst_note(local_start, start, zone), _dst_note(local_end, end, zone)) if note]
    if end <= start:
        # A start shifted forward by the spring gap onto (or past) its end: it keeps its length instead.
        end = start + duration
    return Occurrence(day=local_start.date(), start=start, end=end, note="; ".join(notes))


def _aware(wall: datetime, zone: ZoneInfo) -> datetime:
    """The wall time in ``zone``, fold=0: a skipped time moves forward by the gap, a repeated one is the first."""
    return wall.replace(tzinfo=zone, fold=0).astimezone(UTC)


def _dst_note(wall: datetime, aware: datetime, zone: ZoneInfo) -> str:
    shown = aware.astimezone(zone)
    if shown.replace(tzinfo=None) != wall:
        return f"{wall:%H:%M} does not exist on {wall:%Y-%m-%d} in {zone.key} (clocks go forward): {shown:%H:%M %Z}"
    if wall.replace(tzinfo=zone, fold=1).utcoffset() != wall.replace(tzinfo=zone, fold=0).utcoffset():
        return f"{wall:%H:%M} happens twice on {wall:%Y-%m-%d} in {zone.key} (clocks go back): the first, {shown:%Z}"
    return ""


def _parts(rule: str) -> dict[str, str]:
    parts: dict[str, str] = {}
    for piece in rule.split(";"):
        if not piece:
            continue
        name, sep, value = piece.partition("=")
        if not sep or not value:
            raise InvalidBooking(f"{piece!r} in the repeat rule is not NAME=VALUE.", field="repeat")
        if name not in _KNOWN_PARTS and name not in _SUB_DAILY_PARTS:
            raise InvalidBooking(f"Unknown part {name} in the repeat rule.", field="repeat")
        if name in parts:
            raise InvalidBooking(f"{name} appears twice in the repeat rule.", field="repeat")
        parts[name] = value
    return parts


def _without(rule: str, *names: str) -> str:
    return ";".join(piece for piece in rule.split(";") if piece and piece.partition("=")[0] not in names)


def _until(value: str, zone: ZoneInfo) -> datetime:
    """UNTIL as a naive local time. A date alone means the whole of that day ("until 31 March" books
    the 31st); a UTC time is converted into the zone."""
    try:
        if _DATE_ONLY.match(value):
            return datetime.combine(datetime.strptime(value, "%Y%m%d").date(), time.max)
        if _UTC_DATETIME.match(value):
            moment = datetime.strptime(value, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
            return moment.astimezone(zone).replace(tzinfo=None)
        return datetime.strptime(value, "%Y%m%dT%H%M%S")
    except (ValueError, OverflowError):
        raise InvalidBooking(f"UNTIL={value} is not a valid date.", field="repeat") from None


def _too_many(most: int) -> InvalidBooking:
    return InvalidBooking(
        f"The repeat rule makes more than {most} occurrences (SERIES_MAX_OCCURRENCES): end it sooner or use COUNT.",
        field="repeat",
    )


def _describe(gap: timedelta) -> str:
    hours = gap.total_seconds() / 3600
    return f"{hours:g} hours"
