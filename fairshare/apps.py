from django.apps import AppConfig


class FairshareConfig(AppConfig):
    name = "fairshare"
    verbose_name = "Fair share"

    def ready(self) -> None:
        # The profile page and /api/v1/me/ (accounts and reservations, below us) show each person's factor as
        # parts they do not import; the booking horizon may be capped by it (reservations.limits).
        from accounts.me_parts import me_parts
        from accounts.profile_parts import profile_parts
        from fairshare import checks  # noqa: F401 - registers the system checks
        from fairshare.api import FairShareSerializer, my_fair_share
        from fairshare.horizon import horizon_cap
        from fairshare.pages import profile_section
        from kernel.page_parts import Part
        from reservations.limits import horizon_caps

        profile_parts.register(
            Part(
                name="fair-share",
                title="Fair share",
                template="fairshare/profile_section.html",
                read=profile_section,
                order=50,
            )
        )
        me_parts.register("fair_share", FairShareSerializer, my_fair_share)
        horizon_caps.register(horizon_cap)
