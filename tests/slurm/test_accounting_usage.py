"""End to end on a real cluster with job accounting (tests/slurm/cluster.py, ``accounting=True``): a job its holder
runs in a booking's reservation is read from sacct (slurm/usage.py) and counted as the booking's used GPU-hours
(accounting/slurm_usage.py), in the report as for any booking."""

from __future__ import annotations

import shlex
import time
from datetime import timedelta

import pytest
from django.db.models import Sum
from django.utils import timezone

from accounting.models import UsageHour
from accounting.report import usage_report
from nodes.models import Node
from reservations.services import reservation_create
from slurm.models import ReservationJob, SlurmCluster
from slurm.sacct import Sacct
from slurm.scontrol import Scontrol
from slurm.services import slurm_nodes_import, slurm_reconcile
from slurm.usage import slurm_jobs_read
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db
POLL_SECONDS = 30  # jobs reach slurmdbd after they end, asynchronously


def test_a_job_in_the_reservation_is_the_bookings_used_gpu_time(slurm_accounting_cluster, slurm_accounts, settings):
    cluster = slurm_accounting_cluster
    settings.SLURM_SCONTROL = cluster.scontrol_setting
    slurm_nodes_import(controller=Scontrol(shlex.split(cluster.scontrol_setting)))
    node = Node.objects.get(name=cluster.node.lower())
    holder = UserFactory(username=slurm_accounts[0])
    now = timezone.now()
    start = now.replace(minute=now.minute - now.minute % 15, second=0, microsecond=0)
    booking = reservation_create(user=holder, gpus=list(node.gpus.all()), start=start, end=start + timedelta(hours=1))
    slurm_reconcile(now=timezone.now())
    sacct = Sacct(shlex.split(cluster.sacct_setting))
    try:
        # 4 GPUs x 16 s: a little over one GPU-minute. MAGNETIC: the plain srun lands in the reservation.
        ran = cluster.srun(holder.unix_username, "--gres=gpu:4", "-t", "1", "sleep", "16")
        assert ran.returncode == 0, ran.stderr

        deadline = time.monotonic() + POLL_SECONDS
        while not ReservationJob.objects.filter(reservation=booking, end__isnull=False).exists():
            assert time.monotonic() < deadline, "the job never reached the accounting"
            slurm_jobs_read(sacct=sacct, now=timezone.now())
            time.sleep(0.5)
        read_at = timezone.now() + timedelta(minutes=3)  # read later: the slot's first minutes are whole by then
        slurm_jobs_read(sacct=sacct, now=read_at)
    finally:
        for line in cluster.scontrol("show", "reservation", "-o", check=False).splitlines():
            if line.startswith("ReservationName="):
                cluster.scontrol("delete", line.split()[0], check=False)

    job = ReservationJob.objects.get(reservation=booking)
    assert (job.user, job.gpus) == (holder.unix_username, 4) and job.end - job.start >= timedelta(seconds=16)
    assert SlurmCluster.objects.get().accounting is True
    rows = UsageHour.objects.filter(reservation=booking, source=UsageHour.Source.SLURM)
    assert rows.count() == 4 * len({row.hour for row in rows})  # every booked GPU, every hour so far
    assert rows.aggregate(used=Sum("used_minutes"))["used"] == 2  # 4 x 16 s, rounded up to whole minutes
    (row,) = usage_report(  # usage rows are hourly: a period of whole hours around it
        start=start - timedelta(hours=1), end=start + timedelta(hours=2), by="user", viewer=holder, now=read_at
    ).rows
    assert row.used_gpu_hours == pytest.approx(2 / 60) and row.no_shows == 0


def test_a_cluster_without_accounting_is_recorded_so_and_counts_nothing(slurm_cluster, slurm_accounts, settings):
    settings.SLURM_SCONTROL = slurm_cluster.scontrol_setting
    slurm_nodes_import(controller=Scontrol(shlex.split(slurm_cluster.scontrol_setting)))
    assert slurm_jobs_read(sacct=Sacct(shlex.split(slurm_cluster.sacct_setting)), now=timezone.now()) is None
    cluster = SlurmCluster.objects.get()
    assert cluster.accounting is False and "accounting storage is disabled" in cluster.accounting_problem
    assert not UsageHour.objects.exists()
