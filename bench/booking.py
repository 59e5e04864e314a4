"""Booking throughput: ``reservation_create`` against the raw cost of writing the same rows.

What it measures
    For 1, 4 and 16 concurrent clients (processes, as web workers are, each with its own database
    connection; ``--threads`` for threads of one process, as the figures before issue 20 were taken), how many
    bookings per second ``reservations.services.reservation_create`` makes, with the p50 and p99
    latency of one call. Every call books one GPU for one hour; the clients never compete for a
    slot: each owns its GPUs (and its user) and walks forward in time, one hour after another,
    from 30 days ahead, so every call should succeed (any error is printed).

    The floor: the same clients, each with a plain psycopg connection and no Django, inserting
    one ``reservations_reservation`` row and one ``reservations_allocation`` row per transaction
    for the same kind of non-overlapping slots. ``ratio`` is service rate / raw rate: the share
    of the bare database write speed that the service keeps after its locks, checks, limit
    look-ups and audit entry.

    The booking tables are emptied before every run, so each run starts from the same state.
    One Limit row, the site default, lets the clients book as far ahead as they walk (HORIZON;
    the site ceiling MAX_DAYS_AHEAD would stop them at 90 days) and the node does not require
    approval; the limit check still runs, but with no limit on GPUs at once or weekly hours it
    reads nothing more.

How to run it
    It needs PostgreSQL (the exclusion constraint and row locks are what is measured) and a
    database of its own, whose name contains "bench": it empties the booking tables.

        DATABASE_URL=postgres://postgres@127.0.0.1:5432/portal_bench .venv/bin/python bench/booking.py
        ... bench/booking.py --seconds 10 --clients 1,4,16

    The database is created if it is missing and migrated. DEBUG is forced off so that Django
    does not keep every query. The bench data stays behind after the run.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: bench.* and the portal

from bench import cpu
from bench.benchdb import (
    allow_booking_ahead,
    open_database,
    percentile_ms,
    postgres_version,
    reset_lab,
    run_apart,
    run_together,
)

GPU_COUNT = 64
USER_COUNT = 16
NODE_NAME = "bench-node"
USER_PREFIX = "bench-user-"
SLOT = timedelta(hours=1)
LEAD_TIME = timedelta(days=30)
HORIZON = timedelta(days=360)
MAX_ERRORS_SHOWN = 10


# --- results --------------------------------------------------------------------------------


@dataclass
class ClientResult:
    """What one client thread did."""

    done: int = 0
    latencies: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    client_cpu: float = 0.0  # seconds of CPU the client used while booking
    database_cpu: float | None = None  # ... and its PostgreSQL backend (None: not on this host)


@dataclass
class RunResult:
    """All clients of one run together."""

    clients: int
    elapsed: float
    done: int
    latencies: list[float]
    errors: list[str]
    client_cpu: float = 0.0
    database_cpu: float | None = None

    @property
    def rate(self) -> float:
        return self.done / self.elapsed if self.elapsed > 0 else 0.0

    def cpu_ms_per_booking(self, seconds: float | None) -> str:
        """CPU milliseconds per booking made, or "n/a"."""
        return f"{seconds / self.done * 1000:.1f}" if seconds is not None and self.done else "n/a"

    def percentile_ms(self, pct: float) -> float:
        """Nearest-rank percentile of the per-call latency, in milliseconds."""
        return percentile_ms(self.latencies, pct)


@dataclass(frozen=True)
class Lane:
    """What one client books: its user, and its own GPUs, so no two clients compete."""

    user: Any
    node_id: int
    gpu_ids: tuple[int, ...]


# --- setup ----------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="length of each run (default 5)")
    parser.add_argument("--clients", default="1,4,16", help="comma-separated concurrency levels (default 1,4,16)")
    parser.add_argument(
        "--threads", action="store_true", help="clients as threads of one process (as measured before issue 20)"
    )
    args = parser.parse_args(argv)
    args.levels = [int(part) for part in args.clients.split(",") if part.strip()]
    if args.seconds <= 0 or not args.levels or min(args.levels) < 1 or max(args.levels) > USER_COUNT:
        parser.error(f"--seconds must be positive and each client count between 1 and {USER_COUNT}")
    return args


def empty_bookings() -> None:
    """Empty the tables a booking writes (fast, and the ids restart)."""
    from django.db import connection

    from audit.models import AuditEntry
    from reservations.models import Allocation, Reservation

    tables = ", ".join(
        connection.ops.quote_name(model._meta.db_table) for model in (Allocation, Reservation, AuditEntry)
    )
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {tables} RESTART IDENTITY CASCADE")


def reset_bench_data() -> None:
    """Start from nothing: no bookings, maintenance, limits, GPUs, nodes or bench users."""
    from django.contrib.auth import get_user_model

    reset_lab()
    get_user_model().objects.filter(username__startswith=USER_PREFIX).delete()


def create_fixtures() -> tuple[Any, list[Any], list[int]]:
    """One node with GPU_COUNT GPUs and USER_COUNT ordinary users; returns (node, users, gpu ids)."""
    from django.contrib.auth import get_user_model

    from nodes.models import Gpu, Node

    node = Node.objects.create(name=NODE_NAME, hostname=f"{NODE_NAME}.example", requires_approval=False)
    gpus = Gpu.objects.bulk_create(
        Gpu(node=node, index=i, uuid=f"GPU-bench-{i:08d}", model="Bench GPU", memory_mib=81920)
        for i in range(GPU_COUNT)
    )
    user_model = get_user_model()
    users = [
        user_model.objects.create_user(username=f"{USER_PREFIX}{i}", unix_username=f"bench{i}", is_staff=False)
        for i in range(USER_COUNT)
    ]
    return node, users, sorted(gpu.pk for gpu in gpus)


def make_lanes(node: Any, users: list[Any], gpu_ids: list[int], clients: int) -> list[Lane]:
    """Client i gets user i and every GPU whose position is i modulo the number of clients."""
    return [Lane(user=users[i], node_id=node.pk, gpu_ids=tuple(gpu_ids[i::clients])) for i in range(clients)]


def slots(lane: Lane, now: datetime) -> Iterator[tuple[int, datetime, datetime]]:
    """(gpu id, start, end): hour-long, back to back on the lane's first GPU from LEAD_TIME ahead
    up to HORIZON, then the same on its next GPU. Hours fall on the 15-minute grid."""
    first = now.astimezone(UTC).replace(minute=0, second=0, microsecond=0) + LEAD_TIME
    per_gpu = int((HORIZON - LEAD_TIME) / SLOT)
    for gpu_id in lane.gpu_ids:
        for step in range(per_gpu):
            start = first + step * SLOT
            yield gpu_id, start, start + SLOT


# --- running clients ------------------------------------------------------------------------


def run_clients(
    lanes: list[Lane],
    seconds: float,
    prepare: Callable[[], tuple[Any, int]],
    book: Callable[[Any, Lane, int, datetime, datetime], None],
    finish: Callable[[Any], None],
    *,
    threads: bool = False,
) -> RunResult:
    """Run one client per lane for ``seconds``, all starting together; each books back to back. Each
    client is a process of its own, as web workers are (``threads``: a thread, all sharing one
    interpreter lock, as this bench measured before).

    ``prepare`` opens the client's connection (before the clock starts) and returns it with its
    PostgreSQL backend's pid, ``book`` makes one booking with it, ``finish`` closes it.
    """
    results = [ClientResult() for _ in lanes]
    workers = [
        partial(_client, lane, result, seconds, prepare, book, finish)
        for lane, result in zip(lanes, results, strict=True)
    ]
    if threads:
        elapsed = run_together(workers)  # the threads fill ``results`` in place
    else:
        elapsed, answers = run_apart(workers)  # each process sends back its own copy
        results = [
            answer if isinstance(answer, ClientResult) else ClientResult(errors=[str(answer)]) for answer in answers
        ]
    return RunResult(
        clients=len(lanes),
        elapsed=elapsed,
        done=sum(r.done for r in results),
        latencies=[latency for r in results for latency in r.latencies],
        errors=[error for r in results for error in r.errors],
        client_cpu=sum(r.client_cpu for r in results),
        database_cpu=None
        if any(r.database_cpu is None for r in results)
        else sum(r.database_cpu or 0 for r in results),
    )


def _client(
    lane: Lane,
    result: ClientResult,
    seconds: float,
    prepare: Callable[[], tuple[Any, int]],
    book: Callable[[Any, Lane, int, datetime, datetime], None],
    finish: Callable[[Any], None],
    ready: Callable[[], float],
) -> ClientResult:
    handle, backend_pid = None, 0
    try:
        handle, backend_pid = prepare()
    except Exception as exc:
        result.errors.append(f"connect: {exc!r}")
    deadline = ready() + seconds
    client_before, database_before = time.process_time(), cpu.process_seconds(backend_pid)
    try:
        if handle is not None:
            _book_until(lane, result, deadline, handle, book)
    finally:
        result.client_cpu = time.process_time() - client_before
        database_after = cpu.process_seconds(backend_pid)
        if database_before is not None and database_after is not None:
            result.database_cpu = database_after - database_before
        finish(handle)
    return result


def _book_until(
    lane: Lane,
    result: ClientResult,
    deadline: float,
    handle: Any,
    book: Callable[[Any, Lane, int, datetime, datetime], None],
) -> None:
    for gpu_id, start, end in slots(lane, datetime.now(UTC)):
        began = time.perf_counter()
        if began >= deadline:
            return
        try:
            book(handle, lane, gpu_id, start, end)
        except Exception as exc:
            result.errors.append(f"{type(exc).__name__}: {exc}")
            continue
        result.latencies.append(time.perf_counter() - began)
        result.done += 1
    result.errors.append("ran out of slots: raise HORIZON or give the lanes more GPUs")


# --- the two contenders ---------------------------------------------------------------------


def service_run(lanes: list[Lane], seconds: float, *, threads: bool = False) -> RunResult:
    """Clients calling reservations.services.reservation_create through Django."""
    from django.db import connection

    from reservations.services import reservation_create

    def prepare() -> tuple[Any, int]:
        connection.ensure_connection()
        return connection, connection.connection.info.backend_pid

    def book(_conn: Any, lane: Lane, gpu_id: int, start: datetime, end: datetime) -> None:
        reservation_create(user=lane.user, gpus=[gpu_id], start=start, end=end)

    def finish(_conn: Any) -> None:
        connection.close()

    return run_clients(lanes, seconds, prepare, book, finish, threads=threads)


RAW_RESERVATION_SQL = """
    INSERT INTO reservations_reservation
        (user_id, node_id, start, "end", purpose, status, created_at, created_by_id,
         decision_reason, cancel_reason)
    VALUES (%s, %s, %s, %s, '', 'approved', now(), %s, '', '')
    RETURNING id
"""
# A whole card, as the service writes it: the card is the GPU, placement [0, nodes.models.WHOLE_CARD).
RAW_ALLOCATION_SQL = """
    INSERT INTO reservations_allocation (reservation_id, gpu_id, card_id, placement_start, placement_end, start, "end",
                                         active)
    VALUES (%s, %s, %s, 0, 64, %s, %s, true)
"""


def raw_run(url: str, lanes: list[Lane], seconds: float, *, threads: bool = False) -> RunResult:
    """Clients inserting the same rows with plain psycopg: one transaction per booking."""

    def prepare() -> tuple[psycopg.Connection[Any], int]:
        conn = psycopg.connect(url)
        return conn, conn.info.backend_pid

    def book(conn: psycopg.Connection[Any], lane: Lane, gpu_id: int, start: datetime, end: datetime) -> None:
        user_id = lane.user.pk
        with conn.cursor() as cursor:
            cursor.execute(RAW_RESERVATION_SQL, [user_id, lane.node_id, start, end, user_id])
            row = cursor.fetchone()
            assert row is not None
            cursor.execute(RAW_ALLOCATION_SQL, [row[0], gpu_id, gpu_id, start, end])
        conn.commit()

    def finish(conn: psycopg.Connection[Any] | None) -> None:
        if conn is not None:
            conn.close()

    return run_clients(lanes, seconds, prepare, book, finish, threads=threads)


# --- reporting ------------------------------------------------------------------------------


def report_errors(label: str, result: RunResult) -> None:
    if not result.errors:
        return
    print(f"{label}, {result.clients} clients: {len(result.errors)} errors")
    for message, count in Counter(result.errors).most_common(MAX_ERRORS_SHOWN):
        print(f"  {count} x {message}")


def print_table(pairs: list[tuple[RunResult, RunResult]]) -> None:
    headers = [
        "clients",
        "service bookings/s",
        "p50 ms",
        "p99 ms",
        "CPU ms/booking: client / PostgreSQL",
        "raw psycopg bookings/s",
        "ratio",
    ]
    rows = [
        [
            str(service.clients),
            f"{service.rate:.0f}",
            f"{service.percentile_ms(50):.2f}",
            f"{service.percentile_ms(99):.2f}",
            f"{service.cpu_ms_per_booking(service.client_cpu)} / {service.cpu_ms_per_booking(service.database_cpu)}",
            f"{raw.rate:.0f}",
            f"{service.rate / raw.rate:.2f}" if raw.rate else "n/a",
        ]
        for service, raw in pairs
    ]
    widths = [max(len(cell) for cell in column) for column in zip(headers, *rows, strict=True)]
    lines = [headers, ["-" * width for width in widths], *rows]
    for line in lines:
        print(" | ".join(cell.rjust(width) for cell, width in zip(line, widths, strict=True)))


def print_context(seconds: float, *, threads: bool) -> None:
    print(
        f"booking benchmark: {seconds:g} s per run, clients as {'threads' if threads else 'processes'}, "
        "1-hour slots on 1 GPU per call, "
        f"{GPU_COUNT} GPUs, {USER_COUNT} users, limits: {HORIZON.days + 1} days ahead only, no approval; "
        f"PostgreSQL {postgres_version()}, "
        f"{os.cpu_count()} CPUs"
    )


# --- main -----------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    url = open_database("bench/booking.py", "portal_bench")
    reset_bench_data()
    allow_booking_ahead(HORIZON.days + 1)
    node, users, gpu_ids = create_fixtures()
    print_context(args.seconds, threads=args.threads)

    pairs: list[tuple[RunResult, RunResult]] = []
    for clients in args.levels:
        lanes = make_lanes(node, users, gpu_ids, clients)
        empty_bookings()
        service = service_run(lanes, args.seconds, threads=args.threads)
        report_errors("service", service)
        empty_bookings()
        raw = raw_run(url, lanes, args.seconds, threads=args.threads)
        report_errors("raw psycopg", raw)
        pairs.append((service, raw))
    print()
    print_table(pairs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
