from django.apps import AppConfig


class EnvironmentsConfig(AppConfig):
    name = "environments"
    verbose_name = "Environments"

    def ready(self) -> None:
        # reservations is below us: it reads our launches into its leases, and shows our part of its booking page,
        # through what we register here.
        from environments import receivers  # noqa: F401  (connects the receivers)
        from environments.booking_part import reservation_launches
        from environments.selectors import lease_launches
        from kernel.page_parts import Part
        from reservations.detail_parts import booking_page_parts
        from reservations.leases import lease_launch_readers

        if lease_launches not in lease_launch_readers:
            lease_launch_readers.append(lease_launches)
        booking_page_parts.register(
            Part(
                name="environments",
                title="Environments",
                template="environments/reservation_launches.html",
                read=reservation_launches,
                order=50,
                scripts=("js/launches.js",),
            )
        )
