"""What every benchmark shares: a PostgreSQL database of its own, migrated, and the latency figures.

A benchmark empties booking tables, so it refuses a database whose name lacks "bench".
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

REPO_ROOT = Path(__file__).resolve().parent.parent
POSTGRES_SCHEMES = {"postgres", "postgresql", "pgsql"}


def database_url_or_exit(script: str, example_db: str) -> str:
    """The DATABASE_URL, if it names a PostgreSQL database meant for benchmarks."""
    url = os.environ.get("DATABASE_URL", "")
    if urlsplit(url).scheme not in POSTGRES_SCHEMES:
        print(
            f"{script} needs PostgreSQL: set DATABASE_URL, e.g.\n"
            f"  DATABASE_URL=postgres://portal:portal@127.0.0.1:5432/{example_db} .venv/bin/python {script}",
            file=sys.stderr,
        )
        sys.exit(2)
    dbname = conninfo_to_dict(url).get("dbname") or ""
    if "bench" not in str(dbname):
        print(
            f"{script} empties tables of its database; {dbname!r} does not look like a benchmark "
            f"database. Use one whose name contains 'bench', e.g. {example_db}.",
            file=sys.stderr,
        )
        sys.exit(2)
    return url


def ensure_database(url: str) -> None:
    """Create the database named in ``url`` if it does not exist yet."""
    dbname = str(conninfo_to_dict(url)["dbname"])
    with psycopg.connect(make_conninfo(url, dbname="postgres"), autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [dbname]).fetchone()
        if not exists:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))
            print(f"created database {dbname}")


def setup_django() -> None:
    """Django on the benchmark database, migrated; DEBUG off so queries are not kept."""
    os.environ["DJANGO_SETTINGS_MODULE"] = "portal.settings"
    os.environ["DEBUG"] = "0"
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)


def percentile_ms(latencies: list[float], pct: float) -> float:
    """Nearest-rank percentile of latencies in seconds, in milliseconds (nan when there are none)."""
    if not latencies:
        return float("nan")
    ordered = sorted(latencies)
    rank = max(1, round(pct / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1] * 1000
