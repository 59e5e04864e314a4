"""Throwaway PostgreSQL databases beside the test database, for the backup and upgrade tests (tests/test_backup.py,
tests/test_upgrade.py): made on the test database's server as the test role (which pytest-django already needs
CREATEDB for), named ``restore_<random>`` so that runs side by side never meet, and dropped afterwards whatever
happened, connections still open to them included."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from django.db import connection
from psycopg import sql


def server_url(database: str) -> str:
    """A postgres:// URL for ``database`` on the test database's server, as the test role (DATABASE_URL's form)."""
    db = connection.settings_dict
    return f"postgres://{db['USER']}:{db['PASSWORD']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{database}"


def current_database_url() -> str:
    """The URL of the test database this pytest process uses."""
    return server_url(connection.settings_dict["NAME"])


@contextmanager
def scratch_database() -> Iterator[str]:
    """A new, empty database; yields its URL."""
    name = f"restore_{secrets.token_hex(6)}"
    with psycopg.connect(server_url("postgres"), autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        try:
            yield server_url(name)
        finally:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
