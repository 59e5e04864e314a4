from __future__ import annotations

from django.contrib import admin

from accounting.models import Tariff


@admin.register(Tariff)
class TariffAdmin(admin.ModelAdmin):
    """What a kWh costs and emits, by hour of the day: reports and booking pages price energy with these."""

    list_display = ("name", "hour_from", "hour_until", "price_per_kwh", "co2_g_per_kwh")
