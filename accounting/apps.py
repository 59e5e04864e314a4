from django.apps import AppConfig


class AccountingConfig(AppConfig):
    name = "accounting"
    verbose_name = "GPU accounting"

    def ready(self) -> None:
        from accounting import receivers  # noqa: F401 - counts Slurm bookings' usage from their jobs

        # A booking's page shows its usage so far; reservations is below us and must not import us.
        from accounting.reservation_usage import reservation_usage
        from kernel.page_parts import Part
        from reservations.detail_parts import booking_page_parts

        booking_page_parts.register(
            Part(
                name="usage",
                title="Usage so far",
                template="accounting/reservation_usage.html",
                read=reservation_usage,
                order=100,
            )
        )
