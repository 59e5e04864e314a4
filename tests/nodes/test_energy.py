"""Energy per GPU minute from the cards' counters (nodes/energy.py), stored with the minutes (nodes/usage.py)
and attributed to bookings by the hourly rollup (accounting/rollup.py)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from accounting.models import UsageHour
from accounting.rollup import rollup
from nodes.energy import Counter, energy_minutes
from nodes.ingest import telemetry_record
from nodes.models import GpuMinute, GpuTelemetry
from nodes.usage import usage_during
from tests.conftest import at
from tests.factories import book

pytestmark = pytest.mark.usefixtures("clock")


def report(node, gpu, when, energy_mj, *, estimated=False, **values):
    sample = {"uuid": gpu.uuid, "utilization_pct": 50, "memory_used_mib": None, "temperature_c": None}
    sample |= {"processes": [], "energy_mj": energy_mj, "energy_estimated": estimated, **values}
    telemetry_record(node=node, samples=[sample], now=when)


def minutes(gpu) -> dict:
    rows = GpuMinute.objects.filter(gpu=gpu).order_by("minute")
    return {row.minute: (row.samples, row.energy_mj, row.energy_estimated) for row in rows}


def reading(gpu_id, when, energy_mj, estimated=False) -> GpuTelemetry:
    return GpuTelemetry(gpu_id=gpu_id, at=when, energy_mj=energy_mj, energy_estimated=estimated)


def test_the_first_counter_gives_nothing_and_each_next_one_its_difference_in_its_minutes(node, gpus):
    report(node, gpus[0], at(1) + timedelta(seconds=50), 7_000_000)
    report(node, gpus[0], at(1) + timedelta(seconds=70), 9_000_000)  # 2,000 J over 10 s + 10 s

    assert minutes(gpus[0]) == {
        at(1): (1, 1_000_000, False),
        at(1) + timedelta(minutes=1): (1, 1_000_000, False),
    }


def test_energy_across_a_gap_is_spread_over_its_minutes_marked_estimated_without_counting_them_reported(node, gpus):
    report(node, gpus[0], at(1), 0)
    report(node, gpus[0], at(1) + timedelta(minutes=4), 2_400_000)  # the agent away for four minutes

    assert minutes(gpus[0]) == {
        at(1): (1, 600_000, True),
        at(1) + timedelta(minutes=1): (0, 600_000, True),  # no reading: energy alone
        at(1) + timedelta(minutes=2): (0, 600_000, True),
        at(1) + timedelta(minutes=3): (0, 600_000, True),
        at(1) + timedelta(minutes=4): (1, None, False),  # the reading's own minute: the interval ended at it
    }
    assert usage_during([gpus[0].pk], at(1), at(2)).minutes_reported == 2  # the minutes with readings


def test_a_counter_that_falls_counts_what_it_counted_since_marked_estimated(node, gpus):
    report(node, gpus[0], at(1), 50_000_000)
    report(node, gpus[0], at(1) + timedelta(seconds=10), 300_000)  # the driver reloaded in between

    assert minutes(gpus[0])[at(1)] == (2, 300_000, True)


def test_a_reading_without_a_counter_ends_the_chain_and_the_next_counter_starts_it_again(node, gpus):
    report(node, gpus[0], at(1), 1_000_000)
    report(node, gpus[0], at(1) + timedelta(seconds=10), None)  # a failed read, or an agent from before energy
    report(node, gpus[0], at(1) + timedelta(seconds=20), 3_000_000)
    report(node, gpus[0], at(1) + timedelta(seconds=30), 3_500_000)

    assert minutes(gpus[0])[at(1)] == (4, 500_000, False)  # only the last interval is known


def test_unknown_spans_give_nothing():
    base = at(1)
    before = {1: Counter(base, 1_000, False), 2: Counter(base, 1_000, False), 3: Counter(base, 5_000, False)}
    got = energy_minutes(
        [
            reading(1, base + timedelta(hours=7), 9_000),  # a silence longer than LONGEST_SPREAD: when is unknown
            reading(2, base + timedelta(seconds=5), 2_000, estimated=True),  # another kind of counter
            reading(3, base - timedelta(seconds=5), 4_000),  # older than the one counted
            reading(3, base + timedelta(seconds=5), 6_000),
        ],
        before,
    )
    assert got == {(3, base): (1_000, False)}


def test_the_hourly_rollup_gives_each_booking_its_gpus_energy(node, gpus, alice):
    booking = book(alice, [gpus[0]], at(1), at(2))
    report(node, gpus[0], at(0) + timedelta(minutes=59, seconds=50), 0)
    report(node, gpus[0], at(1) + timedelta(seconds=10), 4_000_000)  # 10 s before the booking, 10 s in it
    report(node, gpus[0], at(1) + timedelta(seconds=30), 6_000_000)

    rollup(since=at(0), until=at(2))

    hours = {row.reservation_id: (row.energy_mj, row.energy_estimated) for row in UsageHour.objects.all()}
    assert hours == {None: (2_000_000, False), booking.pk: (4_000_000, False)}
