"""Deactivate an account from the command line (a script that follows the HR system, say)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from accounts.models import User
from accounts.services import user_deactivate


class Command(BaseCommand):
    help = (
        "Deactivate USERNAME: their logins, tokens, feeds and websockets stop working, their future bookings "
        "are cancelled and running ones released, and the nodes close their GPUs."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--reason", default="", help="Kept in the audit trail.")

    def handle(self, *args: Any, **options: Any) -> None:
        user = User.objects.filter(username=options["username"]).first()
        if user is None:
            raise CommandError(f"No user named {options['username']!r}.")
        if not user_deactivate(user=user, actor=None, reason=options["reason"] or "deactivated from the command line"):
            self.stdout.write(f"{user.get_username()} was already inactive.")
            return
        self.stdout.write(f"{user.get_username()} deactivated: their bookings end and their GPUs close.")
