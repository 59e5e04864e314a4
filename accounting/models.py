"""GPU use per hour, for good, each hour's minutes attributed to the booking that held the GPU."""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
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

    class Source(models.TextChoices):
        TELEMETRY = "telemetry", "The agents' telemetry"
        SLURM = "slurm", "Slurm's job accounting"

    # Telemetry rows are recomputed from the minutes (accounting/rollup.py); a Slurm node's, from the jobs in its
    # bookings' reservations (accounting/slurm_usage.py): each recomputation replaces its own rows only.
    source = models.CharField(max_length=16, choices=Source.choices, default=Source.TELEMETRY)

    class Meta:
        indexes = [
            models.Index(fields=["hour"]),
            models.Index(fields=["reservation"]),
            models.Index(fields=["user", "hour"]),
        ]

    def __str__(self) -> str:
        return f"GPU {self.gpu_id} at {self.hour:%Y-%m-%d %H}:00"


class Tariff(models.Model):
    """What a kWh costs and emits: all day, or in some hours of the day in the site's zone (TIME_ZONE). Reports
    and a booking's page turn energy into cost and CO₂ with these (accounting/tariffs.py). An hourly tariff
    covers [hour_from, hour_until); the all-day one (no hours) covers every hour no hourly one does. A night
    tariff across midnight is two rows (22-24 and 0-6)."""

    name = models.CharField(max_length=80)
    price_per_kwh = models.DecimalField(
        max_digits=10,
        decimal_places=4,
        null=True,
        blank=True,
        validators=[MinValueValidator(0)],
        help_text="In TARIFF_CURRENCY; empty: no cost figures for these hours.",
    )
    co2_g_per_kwh = models.DecimalField(
        "CO₂e g per kWh",
        max_digits=8,
        decimal_places=1,
        null=True,
        blank=True,
        validators=[MinValueValidator(0)],
        help_text="Grams of CO₂ equivalent per kWh; empty: no CO₂ figures for these hours.",
    )
    hour_from = models.PositiveSmallIntegerField(
        null=True, blank=True, validators=[MaxValueValidator(23)], help_text="First hour (0-23); empty: all day."
    )
    hour_until = models.PositiveSmallIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1), MaxValueValidator(24)], help_text="Up to (1-24)."
    )

    class Meta:
        ordering = ["hour_from", "name"]

    def __str__(self) -> str:
        hours = "all day" if self.hour_from is None else f"{self.hour_from:02d}:00-{self.hour_until:02d}:00"
        return f"{self.name} ({hours})"

    @property
    def hours(self) -> range:
        return (
            range(24) if self.hour_from is None or self.hour_until is None else range(self.hour_from, self.hour_until)
        )

    def clean(self) -> None:
        if (self.hour_from is None) != (self.hour_until is None):
            raise ValidationError("Give both hours, or neither for an all-day tariff.")
        if self.hour_from is not None and self.hour_until is not None and self.hour_until <= self.hour_from:
            raise ValidationError(
                "The hours must run forward within a day: for a night tariff across midnight make two, 22-24 and 0-6."
            )
        if self.price_per_kwh is None and self.co2_g_per_kwh is None:
            raise ValidationError("Give a price per kWh, grams of CO₂e per kWh, or both.")
        others = Tariff.objects.exclude(pk=self.pk)
        if self.hour_from is None:
            if others.filter(hour_from__isnull=True).exists():
                raise ValidationError("There is an all-day tariff already: change that one.")
            return
        clash = next(
            (other for other in others.exclude(hour_from__isnull=True) if set(other.hours) & set(self.hours)), None
        )
        if clash is not None:
            raise ValidationError(f"These hours overlap {clash}.")
