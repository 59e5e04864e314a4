"""Energy into cost and CO₂ with the admin's tariffs (accounting.Tariff), hour by hour of the day in the site's
zone: the energy of each hour is priced at the tariff of that hour of the day. Hours no tariff covers, and
tariffs without a price (or without a CO₂ figure), give none of that figure: a report shows cost only for what
it can price, and says so."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

from django.conf import settings
from django.db.models import QuerySet, Sum
from django.db.models.functions import ExtractHour

from accounting.models import Tariff
from nodes.usage import MJ_PER_KWH


@dataclass(frozen=True)
class Rate:
    price_per_kwh: Decimal | None
    co2_g_per_kwh: Decimal | None


@dataclass(frozen=True)
class Cost:
    """Cost (in TARIFF_CURRENCY) and kg of CO₂e of some energy; None where no tariff gave the figure."""

    cost: float | None = None
    co2_kg: float | None = None

    def __add__(self, other: Cost) -> Cost:
        return Cost(_sum(self.cost, other.cost), _sum(self.co2_kg, other.co2_kg))


def _sum(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else a + b


def rates_by_hour() -> list[Rate | None] | None:
    """The rate of each hour of the day (0-23) in the site's zone; None when no tariff is set (one query)."""
    tariffs = list(Tariff.objects.all())
    if not tariffs:
        return None
    rates: list[Rate | None] = [None] * 24
    for tariff in sorted(tariffs, key=lambda t: t.hour_from is not None):  # all-day first, hourly over it
        for hour in tariff.hours:
            rates[hour] = Rate(tariff.price_per_kwh, tariff.co2_g_per_kwh)
    return rates


def energy_by_local_hour(usage: QuerySet, **keys: Any) -> QuerySet:
    """``usage`` (UsageHour rows) summed per ``keys`` (name -> expression) and hour of the day in the site's
    zone: rows of keys, ``local_hour`` and ``energy`` (mJ)."""
    local = ExtractHour("hour", tzinfo=ZoneInfo(settings.TIME_ZONE))
    return usage.values(**keys, local_hour=local).annotate(energy=Sum("energy_mj")).order_by()


def priced(energy_mj: int | None, rate: Rate | None) -> Cost:
    if energy_mj is None or rate is None:
        return Cost()
    kwh = Decimal(energy_mj) / MJ_PER_KWH
    return Cost(
        None if rate.price_per_kwh is None else float(kwh * rate.price_per_kwh),
        None if rate.co2_g_per_kwh is None else float(kwh * rate.co2_g_per_kwh / 1000),
    )


def usage_costs(usage: QuerySet, key: Any = None) -> dict[Any, Cost]:
    """The cost and CO₂ of the energy of ``usage`` (UsageHour rows) per value of ``key`` (an expression; None:
    all of it, under the key None). Empty without tariffs."""
    rates = rates_by_hour()
    costs: dict[Any, Cost] = {}
    if rates is None:
        return costs
    for row in energy_by_local_hour(usage, **({} if key is None else {"key": key})):
        group = row.get("key")
        costs[group] = costs.get(group, Cost()) + priced(row["energy"], rates[row["local_hour"]])
    return costs


def usage_cost(usage: QuerySet) -> Cost:
    """The cost and CO₂ of the energy of ``usage`` (UsageHour rows): nothing without tariffs."""
    return usage_costs(usage).get(None, Cost())
