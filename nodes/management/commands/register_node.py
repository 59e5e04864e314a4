"""Register a GPU node and print, once, what its agent needs."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from nodes.broker_users import BrokerUserError
from nodes.models import Node
from nodes.services import node_register, node_rotate_credentials


class Command(BaseCommand):
    help = "Register a node (or --rotate an existing node's credentials) and print its agent configuration once."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name")
        parser.add_argument("--hostname", help="The host researchers ssh to (default: the name).")
        parser.add_argument("--description", default="")
        parser.add_argument(
            "--rotate", action="store_true", help="New secret, token and broker password for an existing node."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        name = options["name"]
        existing = Node.objects.filter(name=name).first()
        if existing and not options["rotate"]:
            raise CommandError(f"Node {name!r} exists; use --rotate to give its agent new credentials.")
        if options["rotate"] and not existing:
            raise CommandError(f"No node named {name!r} to rotate.")
        try:
            credentials = (
                node_rotate_credentials(node=existing)
                if existing
                else node_register(name=name, hostname=options["hostname"] or name, description=options["description"])
            )
        except ValidationError as exc:
            raise CommandError("; ".join(f"{k}: {' '.join(v)}" for k, v in exc.message_dict.items())) from exc
        except BrokerUserError as exc:  # nothing was created or changed
            raise CommandError(f"No broker user for {name!r}, so nothing changed: {exc}") from exc
        self.stdout.write(
            "# Agent configuration for this node. Shown once: keep it in the agent's config file (mode 0600).\n"
            + credentials.as_config()
        )
        if settings.PORTAL_URL.startswith("http://"):
            # The agent refuses a plain-http portal (its token would travel in clear) unless told otherwise.
            self.stderr.write(
                "Warning: PORTAL_URL is http://, which the agent refuses: serve the portal over https and set "
                "PORTAL_URL to it, or add ALLOW_INSECURE_PORTAL=true to this config on a trusted network only."
            )
