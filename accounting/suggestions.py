"""Free slots near an asked one, ranked by how contended those hours usually are and by the energy price.

Contention of an hour of the week (in the person's zone): everyone's booked GPU-hours that fell into it over
the past SUGGEST_HISTORY_WEEKS weeks (report.demand_by_hour_of_week) over the GPU-hours the fleet had in it
(its cards today × the weeks). A slot's contention is the mean over its time, taken a quarter hour at a time
(every zone's hours begin on a quarter hour of UTC: India's at half past); it is *busy* when one of its hours
is in the busiest quarter of the week's hours (report.peak_hours, as the demand heatmap marks them) with at
least BUSY_FLOOR_PCT of the fleet booked: on a quiet portal no hour is busy.

The candidates are the slots of the same size starting on the asked start's minute of each hour, from a day
before it (never before now) to a week after it; the asked start is one (the same time on other GPUs is the
nearest answer to a refusal of particular ones). The NEAREST with room (reservations.availability.free_at:
free time and others' reserved capacity as a booking sees them; the person's limits are checked when they
book) that do not overlap each other are kept, then ranked (RANKING). Each says why, with the figures it was
ranked on. Advice only: the booking itself is decided by the booking service.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

from django.conf import settings
from django.core.cache import cache

from accounting.report import demand_by_hour_of_week, peak_hours
from accounting.tariffs import Rate, rates_by_hour
from nodes.models import Gpu, Node
from reservations.availability import Window, free_at
from reservations.timegrid import ceil_to_grid, floor_to_grid

NEAREST = 10
BEFORE, AFTER = timedelta(days=1), timedelta(days=7)
BAND_PCT = 10
BUSY_FLOOR_PCT = 50
QUARTER = timedelta(minutes=15)
RANKING = "quiet hours before the busiest quarter, less contention (in steps of 10 %), cheaper energy, nearer"
_DAYS = ("Mondays", "Tuesdays", "Wednesdays", "Thursdays", "Fridays", "Saturdays", "Sundays")


@dataclass(frozen=True)
class Outlook:
    """What the history says about one slot."""

    start: datetime
    end: datetime
    contention_pct: float  # the mean share of the fleet's GPUs booked over the slot's hours of the week
    busiest_pct: float
    busiest_day: int  # Monday 0, in the person's zone
    busiest_hour: int
    busy: bool  # touches an hour of the busiest quarter of the week with BUSY_FLOOR_PCT of the fleet booked
    price_per_kwh: Decimal | None  # the mean over the slot's priced hours; None without tariffs

    def why(self, currency: str) -> str:
        hours = "busy hour" if self.busy else "busiest hour"
        words = (
            f"{hours}: {self.busiest_pct:.0f} % of GPUs booked on past {_DAYS[self.busiest_day]} at "
            f"{self.busiest_hour:02d}:00; {self.contention_pct:.0f} % over the slot"
        )
        if self.price_per_kwh is not None:
            words += f"; energy {self.price_per_kwh:.3f} {currency}/kWh"
        return words

    def rank(self, asked: datetime) -> tuple[Any, ...]:
        price = self.price_per_kwh if self.price_per_kwh is not None else Decimal(0)
        return (self.busy, int(self.contention_pct // BAND_PCT), price, abs(self.start - asked))


@dataclass(frozen=True)
class Suggestion:
    window: Window
    outlook: Outlook


@dataclass(frozen=True)
class Suggestions:
    asked: Outlook
    asked_free: bool
    suggestions: list[Suggestion]
    weeks: int
    cards: int

    @property
    def offer(self) -> bool:
        """Whether a dialog should offer the suggestions: the asked slot has no room, or is busy."""
        return not self.asked_free or self.asked.busy


class History:
    """The share of the fleet booked in each hour of the past weeks (in ``zone``), and the tariffs."""

    def __init__(self, *, now: datetime, zone: str, weeks: int) -> None:
        self.zone = ZoneInfo(zone)
        self.weeks = weeks
        # Past weeks change slowly and reading them is most of the work (a third of a second at 1,000 GPUs):
        # each hour's figures are read once, in the cache all web processes share. Tariffs are read each time.
        key = f"suggest-demand:{zone}:{weeks}:{now:%Y%m%d%H}"
        cached = cache.get(key)
        if cached is None:
            cached = self._read(now, zone, weeks)
            cache.set(key, cached, timeout=3600)
        self.share, peak, self.cards = cached
        self.peak = {tuple(hour) for hour in peak}
        self.rates = rates_by_hour()
        self.site_zone = ZoneInfo(settings.TIME_ZONE)

    @staticmethod
    def _read(now: datetime, zone: str, weeks: int) -> tuple[list[list[float]], list[tuple[int, int]], int]:
        demand = demand_by_hour_of_week(start=now - timedelta(weeks=weeks), end=now, viewer=None, zone=zone)
        cards = Gpu.objects.filter(parent__isnull=True, node__status=Node.Status.ACTIVE).count()
        capacity = weeks * cards
        share = [[min(1.0, value / capacity) if capacity else 0.0 for value in day] for day in demand]
        return share, sorted(peak_hours(demand)), cards

    def outlook(self, start: datetime, end: datetime) -> Outlook:
        seconds = share_sum = 0.0
        busiest = (-1.0, 0, 0)
        busy = False
        priced_seconds, price_sum = 0.0, Decimal(0)
        for piece_start, length in _quarters(start, end):
            local = piece_start.astimezone(self.zone)
            day, hour = local.weekday(), local.hour
            share = self.share[day][hour]
            seconds += length
            share_sum += share * length
            busiest = max(busiest, (share, -day, -hour))  # the first of equals
            busy = busy or ((day, hour) in self.peak and share * 100 >= BUSY_FLOOR_PCT)
            rate = self._rate(piece_start)
            if rate is not None and rate.price_per_kwh is not None:
                priced_seconds += length
                price_sum += rate.price_per_kwh * Decimal(length)
        return Outlook(
            start=start,
            end=end,
            contention_pct=round(100 * share_sum / seconds, 1) if seconds else 0.0,
            busiest_pct=round(100 * busiest[0], 1),
            busiest_day=-busiest[1],
            busiest_hour=-busiest[2],
            busy=busy,
            price_per_kwh=(price_sum / Decimal(priced_seconds)).quantize(Decimal("0.0001")) if priced_seconds else None,
        )

    def _rate(self, at: datetime) -> Rate | None:
        return None if self.rates is None else self.rates[at.astimezone(self.site_zone).hour]


def _quarters(start: datetime, end: datetime) -> Iterator[tuple[datetime, float]]:
    """[start, end) cut at each quarter hour of UTC: (piece start, seconds). Each piece lies in one hour of
    any zone's clock (offsets are whole quarter hours), the person's and the site's."""
    at = start
    while at < end:
        following = min(end, at.replace(minute=at.minute - at.minute % 15, second=0, microsecond=0) + QUARTER)
        yield at, (following - at).total_seconds()
        at = following


def suggest(
    *,
    user: Any,
    gpu_count: int,
    duration: timedelta,
    start: datetime,
    now: datetime,
    zone: str,
    node_name: str | None = None,
    min_memory_mib: int | None = None,
    profile: str = "",
    limit: int = 5,
) -> Suggestions:
    """The asked slot's outlook, whether it has room, and up to ``limit`` ranked free slots near it."""
    start = floor_to_grid(start)
    history = History(now=now, zone=zone, weeks=settings.SUGGEST_HISTORY_WEEKS)
    search = {
        "gpu_count": gpu_count,
        "duration": duration,
        "now": now,
        "node_name": node_name,
        "min_memory_mib": min_memory_mib,
        "profile": profile,
        "user": user,
    }
    asked_free = False
    kept: list[Window] = []
    for window in free_at(starts=_nearest_first(start, now), **search):
        asked_free = asked_free or window.start == start  # the asked start comes first, when it has room
        if not any(window.start < other.end and other.start < window.end for other in kept):
            kept.append(window)
            if len(kept) == NEAREST:
                break
    ranked = sorted(
        (Suggestion(window, history.outlook(window.start, window.end)) for window in kept),
        key=lambda item: item.outlook.rank(start),
    )
    return Suggestions(
        asked=history.outlook(start, ceil_to_grid(start + duration)),
        asked_free=asked_free,
        suggestions=ranked[:limit],
        weeks=history.weeks,
        cards=history.cards,
    )


def _nearest_first(asked: datetime, now: datetime) -> list[datetime]:
    """The candidate starts, each hour from a day before ``asked`` to a week after, nearest first (``asked``
    itself first)."""
    earliest = floor_to_grid(now)
    hours = int(BEFORE / timedelta(hours=1))
    starts = [asked + timedelta(hours=step) for step in range(-hours, int(AFTER / timedelta(hours=1)) + 1)]
    return sorted((at for at in starts if at >= earliest), key=lambda at: (abs(at - asked), at))
