"""The usage of bookings on Slurm nodes, counted from the jobs in their reservations (accounting/slurm_usage.py):
the report's used GPU-hours, efficiency and no-shows mean for them what they mean for the agents' nodes. The jobs
are given here as the portal keeps them (slurm.ReservationJob); reading them from a real sacct is in
tests/slurm/test_sacct.py and test_accounting_usage.py."""

from __future__ import annotations

from datetime import timedelta

import pytest

from accounting.models import UsageHour
from accounting.report import usage_report
from accounting.rollup import rollup
from accounting.slurm_usage import slurm_usage_rollup
from nodes.models import GpuMinute, Node
from reservations.services import reservation_create
from slurm.models import ReservationJob
from slurm.services import slurm_nodes_import
from tests.conftest import at
from tests.factories import node_with_gpus
from tests.slurm.test_scontrol import NODE, RecordedScontrol

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("clock")]


@pytest.fixture
def slurm_gpus():
    node = node_with_gpus(4, name="slurm-a100", manager=Node.Manager.SLURM, books_whole=True)
    return list(node.gpus.order_by("index"))


def job(booking, number: int, gpus: int, start: float, end: float | None) -> ReservationJob:
    return ReservationJob.objects.create(
        job_id=str(number),
        reservation=booking,
        user="alice",
        start=at(start),
        end=None if end is None else at(end),
        gpus=gpus,
        seen_at=at(0),
    )


def test_the_gpu_minutes_of_the_jobs_are_the_bookings_used_gpu_hours(alice, slurm_gpus, carol):
    booking = reservation_create(user=alice, gpus=slurm_gpus, start=at(0), end=at(2))
    job(booking, 1, gpus=2, start=0, end=0.5)  # 2 GPUs x 30 min
    job(booking, 2, gpus=4, start=1, end=1.25)  # 4 GPUs x 15 min
    job(booking, 3, gpus=0, start=1.5, end=2)  # asked for no GPU: used none

    slurm_usage_rollup(reservation_ids=[booking.pk], now=at(2))

    report = usage_report(start=at(-1), end=at(3), by="user", viewer=carol, now=at(2))
    (row,) = report.rows
    assert row.booked_gpu_hours == pytest.approx(8.0)
    assert row.used_gpu_hours == pytest.approx(2.0)  # 60 + 60 GPU-minutes
    assert row.efficiency == pytest.approx(0.25) and row.no_shows == 0 and row.unmeasured_gpu_hours == 0
    assert UsageHour.objects.filter(source=UsageHour.Source.SLURM).count() == 8  # 2 hours x 4 GPUs


def test_a_booking_whose_reservation_ran_no_job_is_a_no_show(alice, slurm_gpus, carol):
    booking = reservation_create(user=alice, gpus=slurm_gpus, start=at(0), end=at(1))
    slurm_usage_rollup(reservation_ids=[booking.pk], now=at(2))
    (row,) = usage_report(start=at(-1), end=at(3), by="user", viewer=carol, now=at(2)).rows
    assert row.no_shows == 1 and row.used_gpu_hours == 0


def test_a_running_job_counts_up_to_now_and_counting_again_changes_nothing(alice, slurm_gpus):
    booking = reservation_create(user=alice, gpus=slurm_gpus, start=at(0), end=at(4))
    job(booking, 1, gpus=4, start=0, end=None)

    slurm_usage_rollup(reservation_ids=[booking.pk], now=at(0.5))
    slurm_usage_rollup(reservation_ids=[booking.pk], now=at(0.5))

    rows = UsageHour.objects.filter(reservation=booking)
    assert rows.count() == 4 and {row.used_minutes for row in rows} == {30}  # only the half hour so far


def test_the_telemetry_rollup_leaves_the_slurm_rows_alone(alice, slurm_gpus):
    booking = reservation_create(user=alice, gpus=slurm_gpus, start=at(0), end=at(1))
    job(booking, 1, gpus=1, start=0, end=1)
    slurm_usage_rollup(reservation_ids=[booking.pk], now=at(1))
    rollup(since=at(-1), until=at(1) + timedelta(minutes=5))
    assert UsageHour.objects.filter(reservation=booking, used_minutes=60).count() == 1


# --- our agent on a Slurm node as well (docs/slurm.md, "How it combines with our agent") -------------------------


def minutes(gpu, first, count: int, utilization: int) -> None:
    GpuMinute.objects.bulk_create(
        GpuMinute(
            gpu=gpu,
            minute=first + timedelta(minutes=i),
            samples=12,
            utilization_samples=12,
            utilization_sum=12 * utilization,
            memory_used_max_mib=1000,
        )
        for i in range(count)
    )


def test_with_our_agent_there_too_the_telemetry_counts_until_the_jobs_do(alice, bob, slurm_gpus, carol):
    measured = reservation_create(user=alice, gpus=slurm_gpus, start=at(0), end=at(1))
    accounted = reservation_create(user=bob, gpus=slurm_gpus, start=at(1), end=at(2))
    for gpu in slurm_gpus:
        minutes(gpu, at(0), 120, utilization=90)  # busy all along, as the agent saw it
    rollup(since=at(-1), until=at(2))
    assert UsageHour.objects.filter(reservation=accounted, source=UsageHour.Source.TELEMETRY).count() == 4

    job(accounted, 1, gpus=1, start=1, end=2)  # the cluster's accounting: one GPU for the hour
    slurm_usage_rollup(reservation_ids=[accounted.pk], now=at(2))
    rollup(since=at(-1), until=at(2))  # the telemetry rollup again: it leaves the accounted booking alone

    assert not UsageHour.objects.filter(reservation=accounted, source=UsageHour.Source.TELEMETRY).exists()
    rows = {row.key: row for row in usage_report(start=at(-1), end=at(3), by="user", viewer=carol, now=at(2)).rows}
    assert rows[bob.pk].used_gpu_hours == pytest.approx(1.0)  # the jobs' count, not the 4 the agent measured
    assert rows[alice.pk].used_gpu_hours == pytest.approx(4.0)  # no accounting for hers: the telemetry's
    assert UsageHour.objects.filter(reservation=measured, source=UsageHour.Source.TELEMETRY).count() == 4


def test_the_import_keeps_the_real_gpus_of_a_node_our_agent_reports_too(db):
    node = node_with_gpus(4, name="vm", manager=Node.Manager.SLURM)
    uuids = sorted(node.gpus.values_list("uuid", flat=True))
    slurm_nodes_import(controller=RecordedScontrol(NODE))
    assert sorted(node.gpus.values_list("uuid", flat=True)) == uuids  # matched by index, none added
