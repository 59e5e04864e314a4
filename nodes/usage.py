"""GPU usage over time: each telemetry reading folded into its GPU's minute (``GpuMinute``), and
what was used during a period (a slot's summary, idle detection).

One statement per report (or batch of reports), whatever the number of GPUs: an upsert that adds the samples to the
minute's sums and keeps its maxima (``INSERT ... ON CONFLICT DO UPDATE``, on PostgreSQL and SQLite
alike).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection
from django.db.models import Count, F, Max, Q, Sum

from nodes.models import GpuMinute, GpuTelemetry

_TABLE = GpuMinute._meta.db_table
MJ_PER_KWH = 3_600_000_000
ROWS_PER_STATEMENT = 1000  # 9,000 parameters: within SQLite's and PostgreSQL's limits


def _larger(column: str) -> str:
    """The larger of the stored and the new value, either of which may be NULL."""
    function = "GREATEST" if connection.vendor == "postgresql" else "MAX"
    stored, new = f"{_TABLE}.{column}", f"excluded.{column}"
    return f"{function}(COALESCE({stored}, {new}), COALESCE({new}, {stored}))"


def usage_record(
    readings: Iterable[GpuTelemetry], energy: dict[tuple[int, datetime], tuple[int, bool]] | None = None
) -> None:
    """Fold readings (GPU, time, values) into their GPUs' minutes, with ``energy`` ((GPU, minute) -> (mJ,
    estimated): nodes/energy.py), which may name minutes no reading fell in. Readings of one GPU in one
    minute are added up first: one upsert cannot touch a row twice."""
    minutes: dict[tuple[int, datetime], list[Any]] = {}
    for reading in readings:
        key = (reading.gpu_id, reading.at.replace(second=0, microsecond=0))
        has_utilization = reading.utilization_pct is not None
        row = minutes.setdefault(key, [0, 0, 0, None, None, None, False])
        row[0] += 1
        row[1] += int(has_utilization)
        row[2] += reading.utilization_pct or 0
        row[3] = _max(row[3], reading.memory_used_mib)
        row[4] = _max(row[4], reading.temperature_c)
    for key, (used_mj, estimated) in (energy or {}).items():
        row = minutes.setdefault(key, [0, 0, 0, None, None, None, False])
        row[5], row[6] = used_mj, estimated
    rows = [(*key, *values) for key, values in minutes.items()]
    for start in range(0, len(rows), ROWS_PER_STATEMENT):
        _upsert_minutes(rows[start : start + ROWS_PER_STATEMENT])


def _upsert_minutes(rows: list[tuple[Any, ...]]) -> None:
    values = ", ".join(["(%s, %s, %s, %s, %s, %s, %s, %s, %s)"] * len(rows))
    # Only constants are formatted in (the table, column names); every value is a parameter.
    sql = (
        f"INSERT INTO {_TABLE} (gpu_id, minute, samples, utilization_samples, utilization_sum, "  # noqa: S608
        f"memory_used_max_mib, temperature_max_c, energy_mj, energy_estimated) VALUES {values} "
        f"ON CONFLICT (gpu_id, minute) DO UPDATE SET "
        f"samples = {_TABLE}.samples + excluded.samples, "
        f"utilization_samples = {_TABLE}.utilization_samples + excluded.utilization_samples, "
        f"utilization_sum = {_TABLE}.utilization_sum + excluded.utilization_sum, "
        f"memory_used_max_mib = {_larger('memory_used_max_mib')}, "
        f"temperature_max_c = {_larger('temperature_max_c')}, "
        f"energy_mj = CASE WHEN excluded.energy_mj IS NULL THEN {_TABLE}.energy_mj "
        f"ELSE COALESCE({_TABLE}.energy_mj, 0) + excluded.energy_mj END, "
        f"energy_estimated = ({_TABLE}.energy_estimated OR excluded.energy_estimated)"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [value for row in rows for value in row])


def kwh(mj: int | None) -> float | None:
    return None if mj is None else mj / MJ_PER_KWH


def _max(stored: int | None, new: int | None) -> int | None:
    return new if stored is None else stored if new is None else max(stored, new)


@dataclass(frozen=True)
class Usage:
    """What GPUs did over a period: None where nothing was reported."""

    mean_utilization_pct: float | None
    peak_memory_mib: int | None
    minutes_reported: int
    energy_mj: int | None = None  # the cards' energy (nodes/energy.py); None without a counter
    idle_energy_mj: int | None = None  # of that, in minutes measured under USAGE_USED_THRESHOLD_PCT
    energy_estimated: bool = False

    @property
    def energy_kwh(self) -> float | None:
        return kwh(self.energy_mj)

    @property
    def idle_energy_kwh(self) -> float:
        return kwh(self.idle_energy_mj) or 0.0

    @property
    def peak_memory_gb(self) -> float | None:
        return None if self.peak_memory_mib is None else self.peak_memory_mib / 1024


def busy_minutes(threshold_pct: float) -> Q:
    """The minutes (``GpuMinute``) whose mean utilisation reached ``threshold_pct``: a minute with no
    utilisation sample is never busy."""
    return Q(utilization_samples__gt=0, utilization_sum__gte=F("utilization_samples") * threshold_pct)


def usage_during(gpu_ids: Iterable[int], start: datetime, end: datetime) -> Usage:
    """Mean utilisation (over every sample of every GPU), peak memory and energy in [start, end)."""
    idle = Q(utilization_samples__gt=0) & ~busy_minutes(settings.USAGE_USED_THRESHOLD_PCT)
    totals = GpuMinute.objects.filter(
        gpu_id__in=list(gpu_ids), minute__gte=start.replace(second=0, microsecond=0), minute__lt=end
    ).aggregate(
        measured=Sum("utilization_samples"),
        total=Sum("utilization_sum"),
        peak=Max("memory_used_max_mib"),
        minutes=Count("minute", distinct=True, filter=Q(samples__gt=0)),  # not minutes with energy alone
        energy=Sum("energy_mj"),
        idle_energy=Sum("energy_mj", filter=idle),
        estimated=Count("minute", filter=Q(energy_estimated=True)),
    )
    samples = totals["measured"] or 0
    return Usage(
        mean_utilization_pct=(totals["total"] / samples) if samples else None,
        peak_memory_mib=totals["peak"],
        minutes_reported=totals["minutes"] or 0,
        energy_mj=totals["energy"],
        idle_energy_mj=totals["idle_energy"],
        energy_estimated=bool(totals["estimated"]),
    )


def usage_prune(now: datetime) -> int:
    """Drop minutes older than TELEMETRY_MINUTES_KEEP_DAYS; returns how many went."""
    cutoff = now - timedelta(days=settings.TELEMETRY_MINUTES_KEEP_DAYS)
    deleted, _ = GpuMinute.objects.filter(minute__lt=cutoff).delete()
    return deleted
