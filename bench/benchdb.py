"""What every benchmark shares: a PostgreSQL database of its own, migrated, and the latency figures.

A benchmark empties booking tables, so it refuses a database whose name lacks "bench".

The benchmarks are scripts (``.venv/bin/python bench/<name>.py``). Each puts the repository root first
on sys.path, then imports what it shares as ``bench.<module>`` (this module; _server.py, the portal
served over HTTP) and the portal's own packages by their names.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any
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
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)


def execute(statement: str, params: Sequence[Any] = ()) -> None:
    """One raw SQL statement on Django's connection (after setup_django)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(statement, params)


def postgres_version() -> str:
    """The server version of Django's connection (after setup_django), for a bench's report."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        (version,) = cursor.fetchone()
    return str(version)


def reset_lab() -> None:
    """Start from nothing: no bookings, maintenance, limits, GPUs, nodes or audit entries.
    CASCADE: tables of other apps that point at bookings (usage hours, mails, alerts) go with them."""
    from nodes.models import Gpu, Node
    from reservations.models import Limit, MaintenanceWindow

    execute("TRUNCATE reservations_allocation, reservations_reservation, audit_auditentry RESTART IDENTITY CASCADE")
    MaintenanceWindow.objects.all().delete()
    Limit.objects.all().delete()
    Gpu.objects.all().delete()
    Node.objects.all().delete()


def allow_booking_ahead(days: int) -> None:
    """The site-wide Limit a bench's ordinary users need to book up to ``days`` ahead, and nothing
    else limited. Without a Limit the site ceiling MAX_DAYS_AHEAD (90 days by default) applies, and
    benches walk further ahead than that; the other fields stay empty (no limit, or the ceiling for
    the longest slot, which no bench's slots come near)."""
    from reservations.models import Limit

    Limit.objects.update_or_create(scope=Limit.Scope.SITE, defaults={"max_days_ahead": days})


def create_lab(
    names: Sequence[str], gpus_per_node: int, models: Sequence[tuple[str, int]], uuid_tag: str = ""
) -> list[tuple[int, int]]:
    """Nodes called ``names`` with ``gpus_per_node`` GPUs each, models taken in turn per node;
    returns (node id, gpu id) per GPU. ``uuid_tag`` keeps one bench's GPU UUIDs apart from another's."""
    from nodes.models import Gpu, Node

    nodes = Node.objects.bulk_create(Node(name=name, hostname=f"{name}.example") for name in names)
    width = 8 - len(uuid_tag)
    gpus = Gpu.objects.bulk_create(
        Gpu(
            node=node,
            index=i,
            uuid=f"GPU-{uuid_tag}{n:0{width}x}-{i:04x}-4000-8000-000000000000",
            model=models[n % len(models)][0],
            memory_mib=models[n % len(models)][1],
        )
        for n, node in enumerate(nodes)
        for i in range(gpus_per_node)
    )
    return [(gpu.node_id, gpu.pk) for gpu in gpus]


def ensure_users(prefix: str, count: int, **extra: Any) -> list[Any]:
    """Users named prefix0 .. prefix{count-1} (just ``prefix`` when count is 1), their unix username
    the name with "_" for "-", created when missing; ordinary researchers unless ``extra`` says
    otherwise (e.g. is_staff=True), which applies only to users created here."""
    from django.contrib.auth import get_user_model

    user_model = get_user_model()
    users = []
    for i in range(count):
        username = f"{prefix}{i}" if count > 1 else prefix
        user = user_model.objects.filter(username=username).first()
        if user is None:
            user = user_model.objects.create_user(username=username, unix_username=username.replace("-", "_"), **extra)
        users.append(user)
    return users


# (user id, node id, gpu id, start, end, status, purpose, created_at)
BookingRow = tuple[int, int, int, datetime, datetime, str, str, datetime]


@contextmanager
def bulk_load(url: str) -> Iterator[psycopg.Cursor[Any]]:
    """A cursor of a connection of its own for COPY; committed, then ANALYZE, on the way out."""
    with psycopg.connect(url) as conn, conn.cursor() as cursor:
        yield cursor
        conn.commit()
        conn.autocommit = True
        cursor.execute("ANALYZE")


def copy_reservations(cursor: psycopg.Cursor[Any], rows: Sequence[BookingRow]) -> list[int]:
    """COPY the reservations (ids taken from their sequence) and one active allocation each, on
    ``cursor`` (of bulk_load); returns the reservations' ids, in the order of ``rows``."""
    cursor.execute(
        "SELECT nextval(pg_get_serial_sequence('reservations_reservation', 'id')) FROM generate_series(1, %s)",
        [len(rows)],
    )
    ids = [row[0] for row in cursor.fetchall()]
    with cursor.copy(
        'COPY reservations_reservation (id, user_id, node_id, start, "end", purpose, status, created_at, '
        "decision_reason, cancel_reason) FROM STDIN"
    ) as copy:
        for pk, (user_id, node_id, _gpu, start, end, status, purpose, created_at) in zip(ids, rows, strict=True):
            copy.write_row((pk, user_id, node_id, start, end, purpose, status, created_at, "", ""))
    from nodes.models import WHOLE_CARD

    # Whole cards (the bench lab has no MIG slices): the card is the GPU, the placement all of it.
    with cursor.copy(
        'COPY reservations_allocation (reservation_id, gpu_id, card_id, placement_start, placement_end, start, "end", '
        "active) FROM STDIN"
    ) as copy:
        for pk, (_user, _node, gpu_id, start, end, *_rest) in zip(ids, rows, strict=True):
            copy.write_row((pk, gpu_id, gpu_id, 0, WHOLE_CARD, start, end, True))
    return ids


def open_database(script: str, example_db: str) -> str:
    """What every bench does first: check DATABASE_URL, create the database if needed, set up
    Django on it and migrate; exits (status 2) when it is not PostgreSQL. Returns the URL."""
    url = database_url_or_exit(script, example_db)
    ensure_database(url)
    setup_django()
    from django.db import connection

    if connection.vendor != "postgresql":
        print(f"{script} needs PostgreSQL, the settings gave {connection.vendor}.", file=sys.stderr)
        sys.exit(2)
    return url


def run_together(workers: Sequence[Callable[[Callable[[], float]], None]]) -> float:
    """Run each worker in a thread of its own, all released at once; returns the seconds from the
    release until the last one finished.

    A worker calls the function it is given once it is ready (its connection open): that waits for
    every other worker and returns the moment of the release (``time.perf_counter()``), from which
    the worker times its run."""
    released: list[float] = []
    barrier = threading.Barrier(len(workers), action=lambda: released.append(time.perf_counter()))

    def ready() -> float:
        barrier.wait()
        return released[0]

    threads = [threading.Thread(target=worker, args=(ready,)) for worker in workers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - released[0]


def run_apart(
    workers: Sequence[Callable[[Callable[[], float]], Any]], *, timeout: float = 900
) -> tuple[float, list[Any]]:
    """As ``run_together``, but each worker in a process of its own (forked), as web workers are: no
    shared interpreter lock between them. Each returns what it did (picklable); returns the seconds from
    the release until the last one finished, and their results in order.

    Open database connections are closed first, so that every process opens its own."""
    from django.db import connections

    connections.close_all()
    context = multiprocessing.get_context("fork")
    released = context.Value("d", 0.0)

    def release() -> None:
        released.value = time.perf_counter()  # CLOCK_MONOTONIC: the same clock in every process

    barrier = context.Barrier(len(workers), action=release)
    answers = context.Queue()

    def ready() -> float:
        barrier.wait()
        return float(released.value)

    def run(index: int, worker: Callable[[Callable[[], float]], Any]) -> None:
        try:
            result = worker(ready)
        except Exception as exc:  # said in the results, so that the parent never waits for an answer in vain
            result = f"error: {exc!r}"
        answers.put((index, result))
        connections.close_all()

    processes = [context.Process(target=run, args=(i, worker)) for i, worker in enumerate(workers)]
    for process in processes:
        process.start()
    results: list[Any] = [None] * len(workers)
    try:
        for _ in workers:
            index, result = answers.get(timeout=timeout)
            results[index] = result
    except queue.Empty:
        codes = [process.exitcode for process in processes]
        for process in processes:
            process.terminate()
        raise RuntimeError(f"a client process gave no answer in {timeout:g} s (exit codes: {codes})") from None
    for process in processes:
        process.join()
    return time.perf_counter() - released.value, results


def percentile_ms(latencies: list[float], pct: float) -> float:
    """Nearest-rank percentile of latencies in seconds, in milliseconds (nan when there are none)."""
    if not latencies:
        return float("nan")
    ordered = sorted(latencies)
    rank = max(1, round(pct / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1] * 1000
