"""Create an API token for a user and print only the token (for automation)."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from accounts.services import api_token_create


class Command(BaseCommand):
    help = "Create a personal API token for USERNAME and print it (it is shown only this once)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--name", default="command line")

    def handle(self, *args: Any, **options: Any) -> None:
        user = get_user_model().objects.filter(username=options["username"]).first()
        if user is None:
            raise CommandError(f"No user named {options['username']!r}.")
        try:
            _, token = api_token_create(user=user, name=options["name"])
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(token)
