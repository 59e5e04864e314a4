"""How the database pool (DB_POOL_MAX_SIZE, psycopg_pool) gets its connections back after the database restarts.

psycopg_pool retries a failed connection with a doubling delay (1, 2, 4, 8 s...) for up to ``reconnect_timeout``
(5 minutes by default): after a database restart of half a minute the pool's next try could come a quarter of a
minute after the database answered, and every request waited or failed until then. portal/settings.py gives up
each series of tries after ``RECONNECT_SECONDS`` instead, and ``try_again`` starts the next series at once, so the
pool tries about once a second for as long as the database is away, and serves again within a second or so of
its return (tests/outages/test_database_restart.py measures it).

Imported by portal/settings.py: nothing here may import Django.
"""

from __future__ import annotations

from typing import Any

RECONNECT_SECONDS = 2.0


def try_again(pool: Any) -> None:
    """psycopg_pool's ``reconnect_failed`` callback: a series of tries ended; ``check()`` starts another (the pool
    grows again when it holds no connection), and drops any idle connection that broke meanwhile."""
    pool.check()
