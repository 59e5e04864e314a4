"""Write a config file for a simulated agent per demo node (used by scripts/run).

A config that still matches the database (same lease secret, token and broker password) is kept, so a
restarted demo's agents trust the snapshots they stored; otherwise fresh credentials are issued (which
makes the node's broker user too). scripts/run re-creates the kept ones' broker users first
(sync_broker_users), should Redis have restarted since. The
stand-in device files live under the same directory: the agent gives them real ACLs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from accounts.services import hash_token
from nodes.agent.config import ConfigError, config_from_values, read_config_file
from nodes.broker_users import BrokerUserError, broker_url_still_valid
from nodes.models import Node
from nodes.services import node_rotate_credentials


class Command(BaseCommand):
    help = "Write simulated agent configs for every node into DIR (default var/agents)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--dir", default=str(settings.VAR_DIR / "agents"))
        parser.add_argument("--portal-url", default="http://127.0.0.1:8000")
        parser.add_argument("--grace-seconds", type=int, default=30)

    def handle(self, *args: Any, **options: Any) -> None:
        directory = Path(options["dir"]).resolve()
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        for node in Node.objects.exclude(status=Node.Status.DISABLED).order_by("name"):
            path = directory / f"{node.name}.conf"
            if _still_valid(path, node):
                self.stdout.write(f"  agent config for {node.name}: {path} (kept)")
                continue
            try:
                credentials = node_rotate_credentials(node=node)
            except BrokerUserError as error:  # nothing changed; say why rather than show a traceback
                raise CommandError(f"No agent config for {node.name}: {error}") from error
            home = directory / node.name
            config = credentials.as_config().replace(
                f"PORTAL_URL={settings.PORTAL_URL}", f"PORTAL_URL={options['portal_url']}"
            )
            # The demo portal answers on plain http: the agents accept that only when told (nodes/agent/config.py).
            insecure = "ALLOW_INSECURE_PORTAL=true\n" if options["portal_url"].startswith("http://") else ""
            path.touch(mode=0o600)
            path.write_text(
                config
                + insecure
                + f"BACKEND=simulated\nSIMULATED_GPUS={node.gpus.count()}\n"
                + f"STATE_DIR={home / 'state'}\nDEVICE_DIR={home / 'dev'}\n"
                + f"GRACE_SECONDS={options['grace_seconds']}\n"
            )
            self.stdout.write(f"  agent config for {node.name}: {path}")


def _still_valid(path: Path, node: Node) -> bool:
    try:
        values = read_config_file(path)
        config_from_values(values)  # one the agent would refuse (an older demo's: http, no ALLOW_INSECURE_PORTAL)
    except ConfigError:
        return False
    token = values.get("AGENT_TOKEN", "")
    return (
        bool(token)
        and values.get("LEASE_SECRET") == node.lease_secret
        and hash_token(token) == node.agent_token_hash
        # The node's own broker user (or, with NODE_BROKER_USERS off, the shared URL) as it is now.
        and broker_url_still_valid(node, values.get("BROKER_URL", ""))
    )
