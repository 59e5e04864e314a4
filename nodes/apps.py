from django.apps import AppConfig


class NodesConfig(AppConfig):
    name = "nodes"
    verbose_name = "GPU nodes"

    def ready(self) -> None:
        from nodes import checks  # noqa: F401 - registers the system checks
