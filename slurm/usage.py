"""Reading the jobs that ran in the portal's reservations from the cluster's accounting (issue 23): where it is on
(slurmdbd; ``sacct`` answers), the usage of a booking on a Slurm node is counted from them (accounting counts it,
on ``signals.jobs_read``), since the portal's agent does not run there to measure it.

Each read asks for the jobs of the window since the last read (an hour more: jobs that ended meanwhile), all
users, and keeps those of reservations named ``gpubook-<id>``. Idempotent: a job is kept once, by its id, and
updated as it runs and ends.
"""

from __future__ import annotations

import shlex
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction

from nodes.models import Node
from reservations.models import Reservation
from slurm import signals
from slurm.controller import SlurmJob
from slurm.models import ReservationJob, SlurmCluster
from slurm.naming import booking_id_of
from slurm.sacct import AccountingOff, Sacct
from slurm.scontrol import SlurmError

FIRST_READ = timedelta(days=7)  # how far back the first read of a newly connected cluster looks
OVERLAP = timedelta(hours=1)


def sacct_from_settings() -> Sacct:
    return Sacct(shlex.split(settings.SLURM_SACCT))


def slurm_jobs_read(*, sacct: Sacct, now: datetime) -> list[int] | None:
    """Read the jobs since the last read; returns the bookings they ran in, or None when the cluster's accounting
    is off (recorded: its bookings' usage stays unknown rather than zero). SlurmError when sacct fails otherwise."""
    cluster, _ = SlurmCluster.objects.get_or_create(pk=1)
    since = (cluster.jobs_read_at or now - FIRST_READ) - OVERLAP
    try:
        jobs = sacct.jobs(start=since, end=now)
    except AccountingOff as off:
        SlurmCluster.objects.filter(pk=1).update(accounting=False, accounting_problem=str(off))
        return None
    except SlurmError as error:
        SlurmCluster.objects.filter(pk=1).update(accounting_problem=str(error))
        raise
    by_booking: dict[int, list[SlurmJob]] = {}
    for job in jobs:
        booking_id = booking_id_of(job.reservation)
        if booking_id is not None:
            by_booking.setdefault(booking_id, []).append(job)
    known = set(Reservation.objects.filter(pk__in=list(by_booking)).values_list("pk", flat=True))
    # And the bookings on Slurm nodes that ran meanwhile without a job: their hours were booked and not used.
    known |= set(
        Reservation.objects.filter(
            node__manager=Node.Manager.SLURM, status=Reservation.Status.APPROVED, start__lt=now, end__gt=since
        ).values_list("pk", flat=True)
    )
    with transaction.atomic():
        for booking_id in known:
            for job in by_booking.get(booking_id, []):
                ReservationJob.objects.update_or_create(
                    job_id=job.job_id,
                    defaults={
                        "reservation_id": booking_id,
                        "user": job.user[:32],
                        "start": job.start,
                        "end": job.end,
                        "gpus": max(0, min(job.gpus, 32767)),
                        "seen_at": now,
                    },
                )
        SlurmCluster.objects.filter(pk=1).update(accounting=True, accounting_problem="", jobs_read_at=now)
        signals.jobs_read.send(sender=SlurmCluster, reservation_ids=sorted(known), now=now)
    return sorted(known)
