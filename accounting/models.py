"""GPU use per hour, for good, each hour's minutes attributed to the booking that held the GPU."""

from __future__ import annotations

from django.conf import settings
from django.db import models


class UsageHour(models.Model):
    """One GPU's use during one hour, under one booking (or none: ``reservation`` empty).

    Rolled up from the per-minute rows (nodes.GpuMinute, kept 30 days) by accounting/rollup.py,
    which attributes each minute to the booking whose allocation covered it. ``user`` repeats the
    booking's holder so reports group by person without a join over a year of rows.
    """

    gpu = models.ForeignKey("nodes.Gpu", on_delete=models.CASCADE, related_name="+")
    hour = models.DateTimeField(help_text="The hour (UTC) the minutes fell in.")
    reservation = models.ForeignKey(
        "reservations.Reservation", null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    minutes_reported = models.PositiveSmallIntegerField(help_text="Minutes with at least one reading.")
    minutes_measured = models.PositiveSmallIntegerField(
        default=0,
        help_text="Minutes with at least one utilisation reading: a MIG slice on a card without GPM reports "
        "memory and processes but no utilisation, so its minutes are reported and not measured.",
    )
    used_minutes = models.PositiveSmallIntegerField(
        help_text="Minutes whose mean utilisation reached USAGE_USED_THRESHOLD_PCT."
    )
    utilization_sum = models.PositiveIntegerField(help_text="Sum of the readings' utilisation (%).")
    utilization_samples = models.PositiveIntegerField()
    memory_used_max_mib = models.PositiveIntegerField(null=True)
    energy_mj = models.PositiveBigIntegerField(
        null=True, help_text="Energy the GPU used in these minutes (nodes/energy.py); none without a counter."
    )
    idle_energy_mj = models.PositiveBigIntegerField(
        null=True, help_text="Of that, the energy of minutes measured below USAGE_USED_THRESHOLD_PCT (idle)."
    )
    energy_estimated = models.BooleanField(default=False, help_text="Part of that energy is estimated.")

    class Meta:
        indexes = [
            models.Index(fields=["hour"]),
            models.Index(fields=["reservation"]),
            models.Index(fields=["user", "hour"]),
        ]

    def __str__(self) -> str:
        return f"GPU {self.gpu_id} at {self.hour:%Y-%m-%d %H}:00"
