"""What the portal knows of the advance reservations it keeps in a Slurm cluster (issue 23): one per booking on a
Slurm-managed node, named ``gpubook-<booking id>``, with the last word from the controller on it."""

from __future__ import annotations

from django.db import models

from reservations.models import Reservation


class SlurmReservation(models.Model):
    class State(models.TextChoices):
        SYNCED = "synced", "In Slurm"
        REFUSED = "refused", "Refused by Slurm"
        REMOVED = "removed", "Removed from Slurm"

    reservation = models.OneToOneField(Reservation, on_delete=models.CASCADE, related_name="slurm")
    name = models.CharField(max_length=64, unique=True)
    state = models.CharField(max_length=16, choices=State.choices)
    problem = models.TextField(blank=True, help_text="Slurm's own words when it refused the reservation.")
    synced_at = models.DateTimeField()

    class Meta:
        ordering = ["-synced_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.get_state_display()})"


class SlurmCluster(models.Model):
    """The one cluster the portal drives (SLURM_SCONTROL or SLURM_RESTD_URL), as the last reconcile pass found it:
    its release and what that release can reserve, and whether its controller answers. One row, made by the
    first pass."""

    api = models.CharField(max_length=16, blank=True, help_text="scontrol or rest: how the portal talks to it.")
    version = models.CharField(max_length=32, blank=True, help_text="Slurm's release, as its controller says.")
    gpu_reservations = models.BooleanField(
        default=False, help_text="Its reservations can hold single GPUs; if not, its nodes are booked whole."
    )
    reached_at = models.DateTimeField(null=True, blank=True, help_text="The last time its controller answered.")
    unreachable_since = models.DateTimeField(
        null=True, blank=True, help_text="Since when its controller has not answered; empty while it does."
    )
    problem = models.TextField(blank=True, help_text="Why it could not be reached, in the words of the attempt.")
    accounting = models.BooleanField(
        null=True, help_text="Whether its accounting (sacct) answers: usage is counted from its jobs if so."
    )
    accounting_problem = models.TextField(blank=True, help_text="Why its jobs could not be read, in sacct's words.")
    jobs_read_at = models.DateTimeField(null=True, blank=True, help_text="The last time its jobs were read.")

    class Meta:
        verbose_name = "Slurm cluster"

    def __str__(self) -> str:
        return f"Slurm {self.version or '(not reached yet)'}"


class ReservationJob(models.Model):
    """A job that ran in one of the portal's reservations, as the cluster's accounting (``sacct``) knows it: what
    the usage of a booking on a Slurm node is counted from (accounting/slurm_usage.py)."""

    job_id = models.CharField(max_length=32, unique=True)
    reservation = models.ForeignKey(Reservation, on_delete=models.CASCADE, related_name="+")
    user = models.CharField(max_length=32, help_text="The unix account that ran it.")
    start = models.DateTimeField()
    end = models.DateTimeField(null=True, blank=True, help_text="Empty while it runs.")
    gpus = models.PositiveSmallIntegerField(help_text="GPUs allocated to it (AllocTRES gres/gpu).")
    seen_at = models.DateTimeField()

    class Meta:
        ordering = ["start"]
        indexes = [models.Index(fields=["reservation"], name="slurm_job_reservation_idx")]
        verbose_name = "job in a reservation"
        verbose_name_plural = "jobs in reservations"

    def __str__(self) -> str:
        return f"job {self.job_id} in gpubook-{self.reservation_id}"
