from django.contrib import admin

from kernel.admin import ReadOnlyAdmin
from slurm.models import SlurmReservation


@admin.register(SlurmReservation)
class SlurmReservationAdmin(ReadOnlyAdmin):
    """What Slurm last said of each of the portal's reservations: refused ones first to look at."""

    list_display = ("name", "state", "problem", "synced_at")
    list_filter = ("state",)
    search_fields = ("name", "problem")
