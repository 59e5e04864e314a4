"""Booking limits: which numbers apply to a user, and whether a booking stays within them.

Resolution, field by field: the user's own override if set; else the most generous value among
the user's groups (a group grants, it never restricts another group's grant); else the site
default; else, for how far ahead and how long, the site ceiling (the settings MAX_DAYS_AHEAD and
MAX_SLOT_HOURS), so that a portal nobody configured still bounds bookings; else no limit.
``requires_approval`` follows the same order, "no approval" being the generous value.

The checks are pure functions over plain periods so they can be reasoned about (and tested)
without a database. A refusal names the limit and the numbers.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from fractions import Fraction
from typing import Any, NamedTuple

from django.conf import settings

from reservations import booking_sql
from reservations.exceptions import LimitExceeded
from reservations.models import Limit
from reservations.timegrid import format_hours, hours

WEEK = timedelta(days=7)
_MOST_DAYS = timedelta.max.days
_NUMERIC_FIELDS = ("max_gpus_at_once", "max_slot_hours", "weekly_gpu_hours", "max_days_ahead")
# The fields that fall back to a setting, not to "no limit", when no Limit row sets them.
CEILING_SETTINGS = {"max_days_ahead": "MAX_DAYS_AHEAD", "max_slot_hours": "MAX_SLOT_HOURS"}


@dataclass(frozen=True)
class EffectiveLimits:
    max_gpus_at_once: int | None = None
    max_slot_hours: Decimal | None = None
    weekly_gpu_hours: Decimal | None = None
    max_days_ahead: int | None = None
    requires_approval: bool = False
    # The fields whose value is the site ceiling (a setting) rather than a Limit row's.
    ceilings: frozenset[str] = frozenset()
    # Why max_days_ahead is shorter than the Limit rows say, when a horizon cap shortened it.
    horizon_reason: str = ""

    @property
    def counts_usage(self) -> bool:
        """Whether checking needs the user's other bookings (not worth reading otherwise)."""
        return self.max_gpus_at_once is not None or self.weekly_gpu_hours is not None


class Period(NamedTuple):
    """GPUs held (or asked for) over [start, end). A MIG slice counts as its share of a card, so ``gpus``
    is a Fraction: exact, so that seven 1/7 slices make one GPU and not a hair more."""

    start: datetime
    end: datetime
    gpus: Fraction | int


def format_gpus(gpus: Fraction | int) -> str:
    """A count of GPUs as people read it: 2, or 0.43 for 3/7 of a card."""
    if Fraction(gpus).denominator == 1:
        return str(int(gpus))
    return f"{float(gpus):.2f}".rstrip("0")


@dataclass(frozen=True)
class HorizonCap:
    days: int
    reason: str  # what the refusal says: "fair share: your factor 0.12 is under 0.25"


class HorizonCaps:
    """Rules of apps above this one that shorten how far ahead a person may book (fairshare's, when the site
    turns it on): registered in their ``ready()``, consulted by ``effective_limits``; the tightest wins."""

    def __init__(self) -> None:
        self._caps: list[Callable[[Any], HorizonCap | None]] = []

    def register(self, cap: Callable[[Any], HorizonCap | None]) -> None:
        if cap not in self._caps:  # ready() may run twice in tests
            self._caps.append(cap)

    def tightest(self, user: Any) -> HorizonCap | None:
        found = [cap for cap in (rule(user) for rule in self._caps) if cap is not None]
        return min(found, key=lambda cap: cap.days, default=None)


horizon_caps = HorizonCaps()


def effective_limits(user: Any) -> EffectiveLimits:
    rows = booking_sql.limit_rows(user)
    site = next((r for r in rows if r.scope == Limit.Scope.SITE), None)
    own = next((r for r in rows if r.scope == Limit.Scope.USER), None)
    groups = [r for r in rows if r.scope == Limit.Scope.GROUP]

    values: dict[str, Any] = {}
    for field in (*_NUMERIC_FIELDS, "requires_approval"):
        group_values = [getattr(r, field) for r in groups if getattr(r, field) is not None]
        if own is not None and getattr(own, field) is not None:
            values[field] = getattr(own, field)
        elif group_values:
            values[field] = all(group_values) if field == "requires_approval" else max(group_values)
        elif site is not None and getattr(site, field) is not None:
            values[field] = getattr(site, field)
    ceilings = frozenset(field for field in CEILING_SETTINGS if field not in values)
    values["max_days_ahead"] = values.get("max_days_ahead", settings.MAX_DAYS_AHEAD)
    values["max_slot_hours"] = values.get("max_slot_hours", Decimal(settings.MAX_SLOT_HOURS))
    cap = horizon_caps.tightest(user)
    if cap is not None and cap.days < values["max_days_ahead"]:
        values["max_days_ahead"], values["horizon_reason"] = cap.days, cap.reason
        ceilings -= {"max_days_ahead"}
    return EffectiveLimits(**values, ceilings=ceilings)


def _where_from(limits: EffectiveLimits, field: str) -> str:
    """' (the site ceiling MAX_DAYS_AHEAD: ...)' when the number is a setting's rather than a Limit
    row's, so that whoever reads the refusal knows what an admin would change; ' (fair share: ...)' when a
    horizon cap set it."""
    if field == "max_days_ahead" and limits.horizon_reason:
        return f" ({limits.horizon_reason})"
    if field not in limits.ceilings:
        return ""
    return f" (the site ceiling {CEILING_SETTINGS[field]}: an admin can set another in a Limit)"


def booking_horizon(limits: EffectiveLimits) -> str:
    """How far ahead these limits let a booking end, in words (for a refusal that should say it)."""
    return f"Bookings may end at most {limits.max_days_ahead} days ahead{_where_from(limits, 'max_days_ahead')}."


def _ceiling_detail(limits: EffectiveLimits, field: str) -> dict[str, str]:
    """{"ceiling": "MAX_DAYS_AHEAD"} in a refusal's details when the number is the setting's."""
    return {"ceiling": CEILING_SETTINGS[field]} if field in limits.ceilings else {}


def check_limits(
    *,
    limits: EffectiveLimits,
    slot: tuple[datetime, datetime],
    asked: Period,
    held: Sequence[Period],
    now: datetime,
) -> None:
    """Raise LimitExceeded if adding ``asked`` to what the user ``held`` breaks a limit.

    ``slot`` is the whole booking (for the longest-slot rule); ``asked`` is the part being added:
    the whole booking when booking, the added time when extending.
    """
    start, end = slot
    # How far ahead comes first: a booking far in the future breaks the longest slot too, but its
    # distance is what the researcher must change. Compared as a difference, never as now + N days:
    # a Limit may allow more days than a datetime can count (timedelta stops at 999,999,999 days).
    if limits.max_days_ahead is not None and end - now > timedelta(days=min(limits.max_days_ahead, _MOST_DAYS)):
        days = math.ceil((end - now) / timedelta(days=1) * 10) / 10
        raise LimitExceeded(
            f"days ahead: the slot ends {format_hours(days)} days from now > {limits.max_days_ahead} allowed"
            f"{_where_from(limits, 'max_days_ahead')}",
            limit="max_days_ahead",
            asked=days,
            allowed=limits.max_days_ahead,
            **_ceiling_detail(limits, "max_days_ahead"),
        )
    if limits.max_slot_hours is not None and hours(end - start) > float(limits.max_slot_hours):
        raise LimitExceeded(
            f"longest slot: {format_hours(hours(end - start))} hours asked > "
            f"{format_hours(float(limits.max_slot_hours))} allowed{_where_from(limits, 'max_slot_hours')}",
            limit="max_slot_hours",
            asked=round(hours(end - start), 2),
            allowed=float(limits.max_slot_hours),
            **_ceiling_detail(limits, "max_slot_hours"),
        )
    if limits.max_gpus_at_once is not None:
        peak = peak_gpus(held, asked.start, asked.end)
        if peak + asked.gpus > limits.max_gpus_at_once:
            raise LimitExceeded(
                f"GPUs at once: {format_gpus(peak)} held + {format_gpus(asked.gpus)} asked > "
                f"{limits.max_gpus_at_once} allowed",
                limit="max_gpus_at_once",
                used=gpus_number(peak),
                asked=gpus_number(asked.gpus),
                allowed=limits.max_gpus_at_once,
            )
    if limits.weekly_gpu_hours is not None:
        used_s, asked_s = busiest_week(held, asked)
        allowed_s = float(limits.weekly_gpu_hours) * 3600
        if used_s + asked_s > allowed_s + 1e-6:
            raise LimitExceeded(
                f"weekly GPU-hours: {format_hours(used_s / 3600)} used + {format_hours(asked_s / 3600)} "
                f"asked > {format_hours(float(limits.weekly_gpu_hours))} allowed",
                limit="weekly_gpu_hours",
                used=round(used_s / 3600, 2),
                asked=round(asked_s / 3600, 2),
                allowed=float(limits.weekly_gpu_hours),
            )


def gpus_number(gpus: Fraction | int) -> int | float:
    """A count of GPUs for JSON: an int when whole, else rounded to three places."""
    return int(gpus) if Fraction(gpus).denominator == 1 else round(float(gpus), 3)


def peak_gpus(held: Iterable[Period], start: datetime, end: datetime) -> Fraction | int:
    """The most GPUs held at any one moment within [start, end)."""
    events: list[tuple[datetime, Fraction | int]] = []
    for period in held:
        lo, hi = max(period.start, start), min(period.end, end)
        if lo < hi:
            events += [(lo, period.gpus), (hi, -period.gpus)]
    # Ends sort before starts at the same instant: back-to-back slots do not add up.
    events.sort(key=lambda event: (event[0], event[1]))
    peak: Fraction | int = 0
    current: Fraction | int = 0
    for _, change in events:
        current += change
        peak = max(peak, current)
    return peak


def _gpu_seconds(periods: Iterable[Period], start: datetime, end: datetime) -> float:
    total = 0.0
    for period in periods:
        overlap = (min(period.end, end) - max(period.start, start)).total_seconds()
        if overlap > 0:
            total += overlap * float(period.gpus)
    return total


def busiest_week(held: Sequence[Period], asked: Period) -> tuple[float, float]:
    """GPU-seconds (already held, asked) in the 7-day window touching ``asked`` that holds the most.

    Total usage in a sliding window is piecewise linear in the window's start, so its maximum is
    at a breakpoint: where the window's start or end meets some period's start or end. Windows are
    kept strictly overlapping the asked period (a second inside its edges).
    """
    lowest = asked.start - WEEK + timedelta(seconds=1)
    highest = asked.end - timedelta(seconds=1)
    candidates = {lowest, highest}
    for period in (*held, asked):
        for edge in (period.start, period.end):
            candidates.update((edge, edge - WEEK))
    best = (0.0, 0.0)
    for window_start in candidates:
        if not lowest <= window_start <= highest:
            continue
        window_end = window_start + WEEK
        used = _gpu_seconds(held, window_start, window_end)
        asked_s = _gpu_seconds([asked], window_start, window_end)
        if used + asked_s > sum(best):
            best = (used, asked_s)
    return best
