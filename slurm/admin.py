from django.contrib import admin

from kernel.admin import ReadOnlyAdmin
from slurm.models import ReservationJob, SlurmCluster, SlurmReservation


@admin.register(SlurmReservation)
class SlurmReservationAdmin(ReadOnlyAdmin):
    """What Slurm last said of each of the portal's reservations: refused ones first to look at."""

    list_display = ("name", "state", "problem", "synced_at")
    list_filter = ("state",)
    search_fields = ("name", "problem")


@admin.register(SlurmCluster)
class SlurmClusterAdmin(ReadOnlyAdmin):
    """The cluster as the last passes found it: its release, what it can reserve, whether it answers."""

    list_display = (
        "__str__", "api", "gpu_reservations", "reached_at", "unreachable_since", "problem", "accounting",
        "accounting_problem",
    )  # fmt: skip


@admin.register(ReservationJob)
class ReservationJobAdmin(ReadOnlyAdmin):
    """The jobs that ran in the portal's reservations, as the cluster's accounting says: the usage of its bookings."""

    list_display = ("job_id", "reservation", "user", "start", "end", "gpus")
    search_fields = ("job_id", "user")
    raw_id_fields = ("reservation",)
