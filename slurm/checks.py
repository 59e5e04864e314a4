"""System checks of the Slurm link's settings (docs/slurm.md, "Connecting a cluster"): what can be known without
asking the cluster. Whether the controller answers is the reconcile pass's to find out (and to alert on)."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.checks import CheckMessage, Warning, register

HINT = "docs/slurm.md, 'Connecting a cluster'."


@register()
def check_slurmrestd_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    if not settings.SLURM_RESTD_URL:
        return []
    problems: list[CheckMessage] = []
    if urlsplit(settings.SLURM_RESTD_URL).scheme not in ("http", "https"):
        problems.append(Warning("SLURM_RESTD_URL must be an http:// or https:// URL.", hint=HINT, id="slurm.W001"))
    if not settings.SLURM_RESTD_USER or not (settings.SLURM_RESTD_TOKEN or settings.SLURM_RESTD_TOKEN_FILE):
        problems.append(
            Warning(
                "SLURM_RESTD_URL is set without SLURM_RESTD_USER and SLURM_RESTD_TOKEN (or SLURM_RESTD_TOKEN_FILE): "
                "slurmrestd will refuse every request, and no booking on a Slurm node becomes a reservation.",
                hint=HINT,
                id="slurm.W002",
            )
        )
    return problems
