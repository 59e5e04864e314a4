"""Energy per GPU minute, from the cards' energy counters (the agent reports a counter with each reading:
gpubook_agent/gpus/energy.py).

Between two readings of a GPU the difference of its counter is the energy it used; that energy is split over
the minutes the interval spans, by time, and added to those minutes (``GpuMinute.energy_mj``, nodes/usage.py),
where the hourly rollup attributes it to the booking that held the GPU, like utilisation. Estimated (marked so
on the minute) where:

- the counter fell: it started again (a driver reload, or an agent restart for a power-integral counter), so
  only what it counted since is known; the energy before the reset is lost;
- the readings are more than ``GAP_SECONDS`` apart (the agent or the portal was away): the energy is known, but
  not how it was spread, and it is spread evenly;
- the counter itself is estimated (the card's power readings added up by the agent).

Energy across a silence longer than ``LONGEST_SPREAD`` is left out: when it was used cannot be told. A
reading without a counter (an agent from before energy reporting, a failed read) ends a GPU's chain: the next
counter starts it again, and the energy between is not counted.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from nodes.models import GpuTelemetry

GAP_SECONDS = 60
LONGEST_SPREAD = timedelta(hours=6)
MINUTE = timedelta(minutes=1)


@dataclass(frozen=True)
class Counter:
    """A GPU's energy counter as read at ``at``."""

    at: datetime
    mj: int
    estimated: bool


def counters_before(gpu_ids: Iterable[int]) -> dict[int, Counter]:
    """The last counter stored for each of these GPUs (their latest reading), where it has one."""
    rows = GpuTelemetry.objects.filter(gpu_id__in=list(gpu_ids)).values_list(
        "gpu_id", "at", "energy_mj", "energy_estimated"
    )
    return {gpu_id: Counter(at, mj, bool(estimated)) for gpu_id, at, mj, estimated in rows if mj is not None}


def energy_minutes(
    readings: Iterable[GpuTelemetry], before: dict[int, Counter]
) -> dict[tuple[int, datetime], tuple[int, bool]]:
    """(GPU id, minute) -> (mJ used in that minute, estimated) from ``readings`` (oldest first) and each GPU's
    counter before them. Whole mJ: each interval's energy is split so that its parts add up to it exactly, so
    storing readings one by one or in a batch gives the same minutes."""
    last = dict(before)
    minutes: dict[tuple[int, datetime], tuple[int, bool]] = {}
    for reading in readings:
        if reading.energy_mj is None:
            # Stored as the GPU's latest reading, it leaves no counter for the next one: the same in a batch.
            last.pop(reading.gpu_id, None)
            continue
        now = Counter(reading.at, reading.energy_mj, bool(reading.energy_estimated))
        then = last.get(reading.gpu_id)
        if then is not None and now.at <= then.at:
            continue  # an older reading than the last one counted: nothing new
        last[reading.gpu_id] = now
        if then is None or now.estimated != then.estimated:
            continue  # the first counter, or another kind of counter: nothing to subtract from
        span = now.at - then.at
        if span > LONGEST_SPREAD:
            continue
        used, reset = (now.mj - then.mj, False) if now.mj >= then.mj else (now.mj, True)
        estimated = now.estimated or reset or span.total_seconds() > GAP_SECONDS
        for minute, part in _split(used, then.at, now.at):
            stored, was_estimated = minutes.get((reading.gpu_id, minute), (0, False))
            minutes[(reading.gpu_id, minute)] = (stored + part, was_estimated or estimated)
    return minutes


def _split(used: int, start: datetime, end: datetime) -> list[tuple[datetime, int]]:
    """``used`` mJ over (start, end], by the time it spends in each minute, in whole mJ adding up to ``used``."""
    total = (end - start).total_seconds()
    parts, done, given = [], 0.0, 0
    minute = start.replace(second=0, microsecond=0)
    while minute < end:
        inside = (min(end, minute + MINUTE) - max(start, minute)).total_seconds()
        if inside > 0:
            done += inside
            share = round(used * done / total) - given
            given += share
            parts.append((minute, share))
        minute += MINUTE
    return parts
