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
