"""Re-create the nodes' broker users from the stored password hashes (after Redis restarted).

Run at the portal's start (scripts/run, docker-compose's web); beat runs the same every minute.
Idempotent: a user that is as it should be is left alone, and no open connection is touched. It touches only the
users its nodes name and those under this portal's prefix (NODE_BROKER_USER_PREFIX, nodes/broker_users.py), never
another portal's on the same Redis. A portal's Redis user that may not list the users (ACL USERS) gets the repairs
done and a warning on stderr: only the leftovers under the prefix are not looked for (nodes.W006).

``--warn-only`` (docker-compose's web): a nodes' broker that refuses (full: one node's credential can open
connections until its maxclients; away) is a line on stderr, not a failure, so that the portal starts whatever
the nodes' broker does; beat tries again every minute, and the pull covers the nodes meanwhile.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from nodes.broker_users import BrokerUserError, broker_users_sync


class Command(BaseCommand):
    help = "Re-create or repair every node's broker user (Redis ACL) from its stored password hash."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--warn-only",
            action="store_true",
            help="Report a nodes' broker that refuses on stderr and exit 0 (the portal's start; beat retries).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if not settings.NODE_BROKER_USERS:
            self.stdout.write("NODE_BROKER_USERS is off: the agents use the portal's own broker credential.")
            return
        try:
            result = broker_users_sync()
        except BrokerUserError as exc:
            if options["warn_only"]:
                self.stderr.write(f"Warning: the nodes' broker users were not synced (beat tries again): {exc}")
                return
            raise CommandError(str(exc)) from exc
        repaired = f": re-created {', '.join(result.repaired)}" if result.repaired else ", all as they should be"
        self.stdout.write(f"broker users of {result.checked} node(s){repaired}")
        if result.removed:
            self.stdout.write(f"removed {', '.join(result.removed)}: users of this portal's prefix that no node has")
        if result.leftovers_unchecked:
            self.stderr.write(
                f"Warning: leftovers of this portal's prefix were not looked for: {result.leftovers_unchecked}"
            )
