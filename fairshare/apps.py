from django.apps import AppConfig


class FairshareConfig(AppConfig):
    name = "fairshare"
    verbose_name = "Fair share"
