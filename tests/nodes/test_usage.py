"""Telemetry folded into per-minute rows (nodes/usage.py), and a period's usage read back."""

from __future__ import annotations

from datetime import timedelta

import pytest

from nodes.ingest import telemetry_record
from nodes.models import GpuMinute
from nodes.usage import usage_during, usage_prune
from tests.conftest import at

pytestmark = pytest.mark.usefixtures("clock")


def report(node, gpu, when, **values):
    sample = {
        "uuid": gpu.uuid,
        "utilization_pct": None,
        "memory_used_mib": None,
        "temperature_c": None,
        "processes": [],
    }
    telemetry_record(node=node, samples=[sample | values], now=when)


def test_readings_of_a_minute_add_up_and_keep_their_maxima(node, gpus):
    report(node, gpus[0], at(1) + timedelta(seconds=5), utilization_pct=90, memory_used_mib=1000, temperature_c=60)
    report(node, gpus[0], at(1) + timedelta(seconds=35), utilization_pct=10, memory_used_mib=3000, temperature_c=55)
    report(node, gpus[0], at(1) + timedelta(seconds=50))  # a card that reported nothing this time
    report(node, gpus[0], at(1) + timedelta(seconds=65), utilization_pct=40, memory_used_mib=500)

    first, second = GpuMinute.objects.filter(gpu=gpus[0]).order_by("minute")
    assert first.minute == at(1)
    assert (first.samples, first.utilization_samples, first.utilization_sum) == (3, 2, 100)
    assert (first.memory_used_max_mib, first.temperature_max_c) == (3000, 60)
    assert (second.minute, second.utilization_sum, second.memory_used_max_mib) == (
        at(1) + timedelta(minutes=1),
        40,
        500,
    )
    assert second.temperature_max_c is None


def test_a_periods_usage_is_the_mean_of_its_samples_and_the_peak_of_its_memory(node, gpus):
    for minute, utilization in enumerate([100, 50, 0]):
        report(
            node, gpus[0], at(1) + timedelta(minutes=minute), utilization_pct=utilization, memory_used_mib=100 * minute
        )
    report(node, gpus[1], at(1), utilization_pct=30, memory_used_mib=9000)
    report(node, gpus[0], at(2), utilization_pct=100, memory_used_mib=99999)  # after the period

    usage = usage_during([gpus[0].pk, gpus[1].pk], at(1), at(1) + timedelta(minutes=30))
    assert usage.mean_utilization_pct == pytest.approx((100 + 50 + 0 + 30) / 4)
    assert usage.peak_memory_mib == 9000
    assert usage.minutes_reported == 3
    nothing = usage_during([gpus[2].pk], at(1), at(2))
    assert (nothing.mean_utilization_pct, nothing.peak_memory_mib, nothing.minutes_reported) == (None, None, 0)


def test_old_minutes_are_pruned(node, gpus, settings):
    settings.TELEMETRY_MINUTES_KEEP_DAYS = 30
    report(node, gpus[0], at(0), utilization_pct=1)
    report(node, gpus[0], at(days=29), utilization_pct=2)
    assert usage_prune(at(days=30, hours=1)) == 1
    assert list(GpuMinute.objects.values_list("utilization_sum", flat=True)) == [2]
