"""Transaction-scoped locks for periodic jobs that must not run twice at once."""

from __future__ import annotations

import zlib

from django.db import connection


def advisory_xact_lock(key: str | int) -> None:
    """Hold a lock until the current transaction ends: PostgreSQL's advisory lock, by name (its
    CRC-32) or by a number of one's own. SQLite serializes writers already (transaction_mode
    IMMEDIATE), so there it does nothing."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            number = zlib.crc32(key.encode()) if isinstance(key, str) else key
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [number])
