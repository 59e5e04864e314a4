"""Re-create the nodes' broker users from the stored password hashes (after Redis restarted).

Run at the portal's start (scripts/run, docker-compose's web); beat runs the same every minute.
Idempotent: a user that is as it should be is left alone, and no open connection is touched.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from nodes.broker_users import BrokerUserError, broker_users_sync


class Command(BaseCommand):
    help = "Re-create or repair every node's broker user (Redis ACL) from its stored password hash."

    def handle(self, *args: Any, **options: Any) -> None:
        if not settings.NODE_BROKER_USERS:
            self.stdout.write("NODE_BROKER_USERS is off: the agents use the portal's own broker credential.")
            return
        try:
            result = broker_users_sync()
        except BrokerUserError as exc:
            raise CommandError(str(exc)) from exc
        repaired = f": re-created {', '.join(result.repaired)}" if result.repaired else ", all as they should be"
        self.stdout.write(f"broker users of {result.checked} node(s){repaired}")
