"""``manage.py slurm_import``: the Slurm cluster's GPU nodes as the portal's Slurm-managed nodes (docs/slurm.md)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from slurm.scontrol import SlurmError
from slurm.services import controller_from_settings, slurm_nodes_import


class Command(BaseCommand):
    help = "Import the Slurm cluster's GPU nodes (scontrol show node) as Slurm-managed nodes."

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            done = slurm_nodes_import(controller=controller_from_settings())
        except SlurmError as error:
            raise CommandError(f"Slurm: {error}") from None
        for name in done.created:
            self.stdout.write(f"created {name}")
        for name in done.updated:
            self.stdout.write(f"updated {name}")
        for name, why in done.skipped.items():
            self.stdout.write(f"skipped {name}: {why}")
        if not (done.created or done.updated or done.skipped):
            self.stdout.write("the cluster has no node with GPU GRES")
