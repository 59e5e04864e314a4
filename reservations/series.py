"""Recurring bookings: a series books every occurrence of a rule as a booking of its own.

Each occurrence is a Reservation (own allocations, approval, mails, release) that points at its Series and
names its local day (``series_day``). Booking goes through the same steps as one booking
(reservations/services.py: ``_require_may_book``, ``_lock_booker_and_load``, ``_check_booking``, ``_create_booking``):
the whole series is checked in one transaction, under the user's lock and then the GPUs' (the usual order),
so a racing single booking either committed first and is seen, or waits and then finds the series' slots taken.

Every occurrence gets an outcome, the same words before (``preview``: nothing is written) and after:

- ``booked`` (after) or ``bookable`` (preview);
- ``refused``: the refusal a single booking would get (slot taken, maintenance, a limit), with its code;
- ``later``: beyond how far ahead the user may book: not booked yet, not a failure. Whoever owns the series
  books them once within reach (``series_book_within_reach``; beat does it daily too);
- ``held_back``: all-or-nothing, and another occurrence was refused, so nothing was booked.

Limits count the series' own occurrences: each occurrence is checked with the ones before it held (the
weekly GPU-hours limit sees each week's occurrences). The rules of the rule text and of DST are in
reservations/recurrence.py; docs/booking-rules.md ("Recurring bookings") tells researchers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, time, timedelta
from fractions import Fraction
from typing import Any

from django.db import transaction
from django.utils import timezone
from rest_framework import status

from accounts.models import User
from nodes.models import Gpu, Node
from reservations.exceptions import BookingError, InvalidBooking, LimitExceeded, NotAllowed
from reservations.freed import announced_after
from reservations.limits import EffectiveLimits, Period, effective_limits
from reservations.models import Reservation, Series
from reservations.recurrence import Occurrence, expand, normalise_rule, series_zone
from reservations.services import (
    _bookable_node,
    _booking_transaction,
    _cancel_locked,
    _cancel_pending_extensions,
    _check_booking,
    _clean_purpose,
    _create_booking,
    _gpu_ids,
    _load_gpus,
    _lock,
    _lock_booker_and_load,
    _lock_booking_rows,
    _require_aware,
    _require_may_book,
    _share,
    _snap_slot,
)

Status = Reservation.Status
Mode = Series.Mode

BOOKED, BOOKABLE, REFUSED, LATER, HELD_BACK = "booked", "bookable", "refused", "later", "held_back"
_WEEK = timedelta(days=7)


class SeriesRefused(BookingError):
    """All or nothing, and some occurrences cannot be booked: nothing was. ``details["occurrences"]`` is the
    per-occurrence report."""

    code = "series_conflict"
    http_status = status.HTTP_409_CONFLICT


@dataclass
class OccurrenceReport:
    day: date
    start: datetime
    end: datetime
    outcome: str
    code: str = ""
    message: str = ""
    note: str = ""
    reservation: Reservation | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "day": self.day.isoformat(),
            "start": self.start.isoformat(),
            "end": self.end.isoformat(),
            "outcome": self.outcome,
            "code": self.code,
            "message": self.message,
            "note": self.note,
            "reservation": self.reservation.pk if self.reservation else None,
            "status": self.reservation.status if self.reservation else None,
        }


@dataclass
class SeriesReport:
    series: Series | None
    preview: bool
    mode: str
    occurrences: list[OccurrenceReport] = field(default_factory=list)

    def count(self, outcome: str) -> int:
        return sum(1 for occurrence in self.occurrences if occurrence.outcome == outcome)

    @property
    def summary(self) -> str:
        if not self.occurrences:
            return "Nothing to book: every occurrence still to come has a booking (or was cancelled)."
        done = self.count(BOOKABLE) if self.preview else self.count(BOOKED)
        parts = [f"{done} of {len(self.occurrences)} occurrences {'can be' if self.preview else 'were'} booked"]
        if self.count(REFUSED):
            parts.append(f"{self.count(REFUSED)} refused")
        if self.count(LATER):
            parts.append(f"{self.count(LATER)} not bookable yet (beyond how far ahead you may book)")
        if self.count(HELD_BACK):
            parts.append(f"{self.count(HELD_BACK)} held back (all or nothing)")
        return ", ".join(parts) + "."

    def as_dict(self) -> dict[str, Any]:
        return {
            "series": self.series.pk if self.series else None,
            "preview": self.preview,
            "mode": self.mode,
            "summary": self.summary,
            "booked": self.count(BOOKED),
            "bookable": self.count(BOOKABLE),
            "refused": self.count(REFUSED),
            "later": self.count(LATER),
            "held_back": self.count(HELD_BACK),
            "occurrences": [occurrence.as_dict() for occurrence in self.occurrences],
        }


# --- public operations ---------------------------------------------------------------------


def series_create(
    *,
    user: User,
    gpus: Sequence[Gpu | int],
    start: datetime,
    end: datetime,
    rule: str,
    zone: str,
    mode: str = Mode.ALL_OR_NOTHING,
    purpose: str = "",
    preview: bool = False,
    actor: Any | None = None,
) -> SeriesReport:
    """Book ``rule``'s occurrences of [start, end) (the first occurrence, read as wall time in ``zone``).

    ``preview`` writes nothing and returns what booking would do now. Otherwise, all or nothing: every
    occurrence within reach is booked, or SeriesRefused (nothing written) names the refused ones; skip
    conflicts: the rest are booked (SeriesRefused only when none could be, nor later).
    """
    actor = actor or user
    _require_may_book(user, actor)
    mode = _mode(mode)
    tz = series_zone(zone)
    rule = normalise_rule(rule)
    _require_aware(start, "start")
    _require_aware(end, "end")
    local_start, local_end = timezone.localtime(start, tz), timezone.localtime(end, tz)
    duration = local_end.replace(tzinfo=None) - local_start.replace(tzinfo=None)
    if end <= start or duration <= timedelta(0):
        raise InvalidBooking("The end must be after the start.", field="end")
    first_day, start_time = local_start.date(), local_start.time().replace(tzinfo=None)
    occurrences = expand(rule=rule, zone=tz, first_day=first_day, start_time=start_time, duration=duration, strict=True)
    purpose = _clean_purpose(purpose)
    gpu_ids = _gpu_ids(gpus)

    with _booking_transaction():
        units = _lock_booker_and_load(user, gpu_ids)
        node = _bookable_node(units)
        limits = effective_limits(user)
        now = timezone.now()
        report = SeriesReport(series=None, preview=preview, mode=mode)
        report.occurrences = _plan(user=user, actor=actor, node=node, units=units, limits=limits, wanted=occurrences)
        if preview:
            return report
        _refuse_unless_bookable(report)
        series = Series.objects.create(
            user=user,
            node=node,
            rule=rule,
            zone=tz.key,
            first_day=first_day,
            start_time=start_time,
            duration=duration,
            mode=mode,
            purpose=purpose,
            created_at=now,
            created_by=actor,
        )
        series.gpus.set(gpu_ids)
        report.series = series
        _book_planned(report, series=series, user=user, actor=actor, node=node, units=units, limits=limits)
    return report


def series_book_within_reach(
    *, series: Series, actor: Any, mode: str = Mode.SKIP_CONFLICTS, preview: bool = False
) -> SeriesReport:
    """Book the series' occurrences that have no booking yet and can be booked now (they came within
    how far ahead the owner may book, or a slot freed up). Occurrences cancelled or rejected one by one
    keep their record and are not booked again. Skips conflicts by default (the daily task does)."""
    _require_owner_or_admin(actor, series)
    return _rebook(series=series, actor=actor, mode=_mode(mode), preview=preview, from_day=None, cancel_first=False)


def series_cancel(
    *, series: Series, actor: Any, scope: str = "all", from_day: date | None = None, reason: str = ""
) -> list[Reservation]:
    """Cancel the whole series (``scope="all"``) or the occurrence of ``from_day`` and those after it
    (``"following"``): their live bookings not started yet are cancelled (each as a normal cancellation,
    audited and mailed), and no occurrence from then on is booked any more. Returns the cancelled bookings."""
    _require_owner_or_admin(actor, series)
    if scope not in ("all", "following"):
        raise InvalidBooking(f"Unknown scope {scope!r}: use all or following.", field="scope")
    if scope == "following" and from_day is None:
        raise InvalidBooking("Say from which occurrence (its day) to cancel.", field="from")
    cut = series.first_day if scope == "all" else from_day
    assert cut is not None
    reason = (reason or "").strip() or f"series #{series.pk} cancelled from {cut.isoformat()}"
    with _booking_transaction():
        gpu_ids = _live_gpu_ids(series, cut)
        _lock_booker_quietly(series.user, gpu_ids)
        locked = Series.objects.select_for_update().get(pk=series.pk)
        cancelled = _cancel_from(locked, cut=cut, actor=actor, reason=reason)
        if locked.ends_before is None or cut < locked.ends_before:
            locked.ends_before = cut
            locked.save(update_fields=["ends_before"])
    series.ends_before = locked.ends_before
    return cancelled


def series_edit(
    *,
    series: Series,
    actor: Any,
    from_day: date | None = None,
    start_time: time | None = None,
    duration: timedelta | None = None,
    gpus: Sequence[Gpu | int] | None = None,
    mode: str = Mode.ALL_OR_NOTHING,
    preview: bool = False,
) -> SeriesReport:
    """Change the time of day, the duration or the GPUs of the occurrences from ``from_day`` on (default:
    all that have not started), by cancelling their bookings and booking them again as changed, in one
    transaction with ``mode``'s rules: all or nothing leaves everything as it was when one is refused.
    Occurrences cancelled one by one before stay cancelled. ``preview`` reports and changes nothing."""
    _require_owner_or_admin(actor, series)
    mode = _mode(mode)
    new_start_time = start_time if start_time is not None else series.start_time
    new_duration = duration if duration is not None else series.duration
    new_gpu_ids = _gpu_ids(gpus) if gpus is not None else sorted(series.gpus.values_list("pk", flat=True))
    # The rule must still make sense with the new duration (no overlapping occurrences).
    expand(
        rule=series.rule,
        zone=series_zone(series.zone),
        first_day=series.first_day,
        start_time=new_start_time,
        duration=new_duration,
        strict=True,
    )
    try:
        # What the edit frees is announced (to the waitlist) once it has booked again: its own slots first.
        with transaction.atomic(), announced_after():
            old_gpu_ids = _live_gpu_ids(series, from_day or series.first_day)
            _require_may_book(series.user, actor)
            _lock_booker_quietly(series.user, sorted({*old_gpu_ids, *new_gpu_ids}))
            units = _load_gpus(new_gpu_ids)
            node = _bookable_node(units)
            locked = Series.objects.select_for_update().get(pk=series.pk)
            locked.start_time, locked.duration, locked.node = new_start_time, new_duration, node
            locked.save(update_fields=["start_time", "duration", "node"])
            locked.gpus.set(new_gpu_ids)
            report = _rebook(
                series=locked, actor=actor, mode=mode, preview=preview, from_day=from_day, cancel_first=True
            )
            if preview:
                raise _Undo(report)
    except _Undo as undo:
        return undo.report
    for name in ("start_time", "duration", "node_id"):
        setattr(series, name, getattr(locked, name))
    return report


def series_book_due(*, now: datetime | None = None) -> int:
    """Beat's daily run: every series still running books what came within reach. Returns how many
    occurrences were booked. A series whose owner cannot book (disabled account) is left alone."""
    now = now or timezone.now()
    booked = 0
    for series in Series.objects.select_related("user").filter(user__is_active=True).order_by("pk"):
        if series.ends_before is not None and series.ends_before <= series.first_day:
            continue
        try:  # one series that cannot book (or whose stored rule no longer expands) stops none of the others
            if all(occurrence.start <= now for occurrence in _expand_series(series)):
                continue  # over: nothing left to book
            report = series_book_within_reach(series=series, actor=series.user)
        except BookingError:
            continue
        booked += report.count(BOOKED)
    return booked


def series_occurrences(series: Series) -> list[dict[str, Any]]:
    """Every occurrence of the series with its booking (the latest for that day, live first) and its state
    in words: what the series page and ``GET /api/v1/series/{id}/`` show."""
    bookings: dict[date, Reservation] = {}
    for reservation in series.occurrences.select_related("node").order_by("series_day", "created_at", "pk"):
        assert reservation.series_day is not None
        current = bookings.get(reservation.series_day)
        if current is None or reservation.is_live or not current.is_live:
            bookings[reservation.series_day] = reservation
    now = timezone.now()
    rows = []
    for occurrence in _expand_series(series, whole=True):
        booking = bookings.get(occurrence.day)
        if booking is not None:
            state = booking.status
        elif series.ends_before is not None and occurrence.day >= series.ends_before:
            state = "cancelled"
        elif occurrence.end <= now:
            state = "missed"
        else:
            state = "not_booked"
        rows.append(
            {
                "day": occurrence.day,
                "start": booking.start if booking else occurrence.start,
                "end": booking.end if booking else occurrence.end,
                "state": state,
                "reservation": booking,
                "note": occurrence.note,
            }
        )
    return rows


# --- planning and booking --------------------------------------------------------------------


class _Undo(Exception):
    """Rolls a preview's writes back, carrying its report out."""

    def __init__(self, report: SeriesReport) -> None:
        super().__init__("preview")
        self.report = report


def _plan(
    *, user: User, actor: Any, node: Node, units: list[Gpu], limits: EffectiveLimits, wanted: Sequence[Occurrence]
) -> list[OccurrenceReport]:
    """Each occurrence checked as a new booking, with the ones before it (not written yet) held too."""
    share: Fraction = _share(units)
    planned: list[Period] = []
    reports = []
    for occurrence in wanted:
        start, end = occurrence.start, occurrence.end
        try:
            now = timezone.now()
            start, end = _snap_slot(occurrence.start, occurrence.end, now)
            nearby = [p for p in planned if p.start < end + _WEEK and p.end > start - _WEEK]
            _check_booking(
                user=user,
                actor=actor,
                node=node,
                gpus=units,
                limits=limits,
                start=start,
                end=end,
                now=now,
                also_held=nearby,
            )
        except LimitExceeded as exc:
            outcome = LATER if exc.details.get("limit") == "max_days_ahead" else REFUSED
            reports.append(_report(occurrence, start, end, outcome, exc))
        except BookingError as exc:
            reports.append(_report(occurrence, start, end, REFUSED, exc))
        else:
            planned.append(Period(start, end, share))
            reports.append(OccurrenceReport(occurrence.day, start, end, BOOKABLE, note=occurrence.note))
    return reports


def _report(
    occurrence: Occurrence, start: datetime, end: datetime, outcome: str, exc: BookingError
) -> OccurrenceReport:
    return OccurrenceReport(
        occurrence.day, start, end, outcome, code=exc.code, message=exc.message, note=occurrence.note
    )


def _refuse_unless_bookable(report: SeriesReport) -> None:
    """All or nothing: any refusal holds back the rest. Skip conflicts: refused only when nothing at all
    can be booked, now or later."""
    refused = report.count(REFUSED)
    if report.mode == Mode.ALL_OR_NOTHING and refused:
        for occurrence in report.occurrences:
            if occurrence.outcome == BOOKABLE:
                occurrence.outcome = HELD_BACK
        first = next(o for o in report.occurrences if o.outcome == REFUSED)
        raise SeriesRefused(
            f"{refused} of {len(report.occurrences)} occurrences cannot be booked, so none was (all or nothing). "
            f"The first: {first.day.isoformat()}: {first.message} Choose skip conflicts to book the others.",
            **report.as_dict(),
        )
    if not report.count(BOOKABLE) and not report.count(LATER):
        refusal = next((o for o in report.occurrences if o.outcome == REFUSED), None)
        raise SeriesRefused(
            "None of the occurrences can be booked"
            + (f": {refusal.day.isoformat()}: {refusal.message}" if refusal else "."),
            **report.as_dict(),
        )


def _book_planned(
    report: SeriesReport,
    *,
    series: Series,
    user: User,
    actor: Any,
    node: Node,
    units: list[Gpu],
    limits: EffectiveLimits,
) -> None:
    now = timezone.now()
    for occurrence in report.occurrences:
        if occurrence.outcome != BOOKABLE:
            continue
        occurrence.reservation = _create_booking(
            user=user,
            actor=actor,
            node=node,
            gpus=units,
            limits=limits,
            start=occurrence.start,
            end=occurrence.end,
            purpose=series.purpose,
            now=now,
            series=series,
            series_day=occurrence.day,
        )
        occurrence.outcome = BOOKED


def _rebook(
    *, series: Series, actor: Any, mode: str, preview: bool, from_day: date | None, cancel_first: bool
) -> SeriesReport:
    """Book the series' occurrences from ``from_day`` (default: all) that have not started and have no live
    booking; with ``cancel_first``, their live bookings are cancelled first (an edit)."""
    user = series.user
    _require_may_book(user, actor)
    report = SeriesReport(series=series, preview=preview, mode=mode)
    with _booking_transaction():
        gpu_ids = sorted(series.gpus.values_list("pk", flat=True))
        units = _lock_booker_and_load(user, gpu_ids)
        node = _bookable_node(units)
        limits = effective_limits(user)
        now = timezone.now()
        start_day = from_day or series.first_day
        rebooking: set[date] = set()
        if cancel_first:
            cancelled = _cancel_from(series, cut=start_day, actor=actor, reason=f"series #{series.pk} changed")
            rebooking = {r.series_day for r in cancelled if r.series_day is not None}
        # Days with a booking of any state are left alone (cancelled or rejected one by one: kept so).
        recorded = set(series.occurrences.filter(series_day__gte=start_day).values_list("series_day", flat=True))
        live = set(
            series.occurrences.filter(series_day__gte=start_day, status__in=Reservation.LIVE_STATUSES).values_list(
                "series_day", flat=True
            )
        )
        wanted = [
            occurrence
            for occurrence in _expand_series(series)
            if occurrence.day >= start_day
            # An edit that moves a booking to a time already past is refused for it, not dropped in silence.
            and (occurrence.start > now or occurrence.day in rebooking)
            and occurrence.day not in live
            and (occurrence.day not in recorded or occurrence.day in rebooking)
        ]
        report.occurrences = _plan(user=user, actor=actor, node=node, units=units, limits=limits, wanted=wanted)
        if preview:
            return report
        if wanted:
            _refuse_unless_bookable(report)
        _book_planned(report, series=series, user=user, actor=actor, node=node, units=units, limits=limits)
    return report


def _cancel_from(series: Series, *, cut: date, actor: Any, reason: str) -> list[Reservation]:
    """Cancel the series' live bookings from ``cut`` on that have not started (under the caller's locks)."""
    now = timezone.now()
    cancelled = []
    for pk in (
        series.occurrences.filter(series_day__gte=cut, status__in=Reservation.LIVE_STATUSES, start__gt=now)
        .order_by("start")
        .values_list("pk", flat=True)
    ):
        locked = _lock(pk)
        _cancel_locked(locked, actor=actor, now=now, reason=reason)
        _cancel_pending_extensions(locked, actor=actor, now=now, reason=reason)
        cancelled.append(locked)
    return cancelled


def _expand_series(series: Series, *, whole: bool = False) -> list[Occurrence]:
    """The occurrences still to book (before ``ends_before``), or with ``whole`` every one of the rule."""
    occurrences = expand(
        rule=series.rule,
        zone=series_zone(series.zone),
        first_day=series.first_day,
        start_time=series.start_time,
        duration=series.duration,
    )
    if series.ends_before is not None and not whole:
        occurrences = [o for o in occurrences if o.day < series.ends_before]
    return occurrences


def _live_gpu_ids(series: Series, cut: date) -> list[int]:
    return sorted(
        set(
            series.occurrences.filter(
                series_day__gte=cut, status__in=Reservation.LIVE_STATUSES, allocations__isnull=False
            ).values_list("allocations__gpu_id", flat=True)
        )
    )


def _lock_booker_quietly(user: User, gpu_ids: list[int]) -> None:
    """The usual locks (user, then GPUs) for changing a series, whether or not its owner may still book."""
    _lock_booking_rows(user_id=user.pk, gpu_ids=gpu_ids)


def _require_owner_or_admin(actor: Any, series: Series) -> None:
    if actor.pk != series.user_id and not actor.is_booking_admin:
        raise NotAllowed(f"Only the owner or an admin can change series #{series.pk}.")


def _mode(mode: str) -> str:
    if mode not in Mode.values:
        raise InvalidBooking(
            f"Unknown mode {mode!r}: use {Mode.ALL_OR_NOTHING.value} (all or nothing) or "
            f"{Mode.SKIP_CONFLICTS.value} (skip conflicts).",
            field="mode",
        )
    return mode
