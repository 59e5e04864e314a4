from django.apps import AppConfig


class SlurmConfig(AppConfig):
    name = "slurm"
    verbose_name = "Slurm clusters"

    def ready(self) -> None:
        # A booking's page shows its Slurm reservation; reservations is below us and must not import us.
        from kernel.page_parts import Part
        from reservations.detail_parts import booking_page_parts
        from slurm import checks, receivers  # noqa: F401  (registers the system checks, connects the receivers)
        from slurm.booking_part import reservation_slurm

        booking_page_parts.register(
            Part(name="slurm", title="Slurm", template="slurm/reservation_slurm.html", read=reservation_slurm, order=40)
        )
