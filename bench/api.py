"""The REST API through the production ASGI server: booking throughput and read latency.

What it measures
    Everything goes over HTTP to daphne (``portal.asgi:application``, one process as scripts/run runs it),
    or with ``--web-processes N`` to the production server (gunicorn with N uvicorn workers, as the
    Dockerfile runs it), started by this script as a subprocess on 127.0.0.1 with DEBUG=0 and a per-token
    rate so high that throttling never answers 429. The clients are threads of this process using
    ``http.client`` with keep-alive, one connection each.

    1. Booking: for each client count (default 1 and 16), every client has its own user, API
       token and GPU, and POSTs /api/v1/reservations/ with {"gpus": [its GPU], "start", "end"}
       back to back for ``--seconds``: one-hour slots on the hour, from 30 days ahead, walking
       forward, so no two requests compete for a slot and every one should answer 201. Reported:
       201s per second, p50/p99 latency of the 201s, and the other answers by status (the first
       bodies of those are printed). The booking node and its bookings are deleted before each run.

    2. Reads over a large data set: 25 nodes x 40 GPUs = 1,000 GPUs and 100,000 approved
       reservations (one allocation each, 100 per GPU: one a day over the 50 days before and the
       50 days after the time of loading, so some run now, some are past, some upcoming). One
       client, sequential requests, each URL ``--requests`` times after one warm-up request:
       GET /api/v1/gpus/ (default page of 100), /api/v1/gpus/?limit=1000,
       /api/v1/reservations/?limit=100, /api/v1/availability/?gpus=2&hours=4, and the calendar's data
       (/api/v1/calendar/) for today, for this week of one node and for this week of every GPU, and the
       suggestions for 2 GPUs, 4 hours and for a whole node, 8 hours, from tomorrow 10:00
       (/api/v1/availability/suggest/). Reported:
       requests per second, p50/p99 latency, and the size of the answer.

    The data set is loaded with COPY (then ANALYZE) only when it is not there yet (1,000 GPUs,
    100,000 reservations, some still upcoming a week from now); --rebuild loads it anew.

How to run it
    It needs PostgreSQL and a database of its own, whose name contains "bench": a rebuild empties
    the booking tables and deletes every node and GPU; every run empties the audit table and
    deletes every booking limit and maintenance window (so none applies but one site-wide Limit
    letting the booking clients book HORIZON ahead) and its own old tokens.

        DATABASE_URL=postgres://portal:portal@127.0.0.1:5432/portal_bench_api .venv/bin/python bench/api.py
        ... bench/api.py --seconds 10 --clients 1,16 --requests 50 --rebuild
        ... bench/api.py --clients 4,16 --repeat 5      # five booking runs each, and their spread

    The database is created if it is missing and migrated. The bench data stays behind after the
    run, so the next run skips the load. The server's log goes to a temporary file: its tail is
    printed if the server does not come up, and the exceptions in it if any request answered 5xx.
"""

from __future__ import annotations

import argparse
import http.client
import os
import random
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from statistics import median
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: bench.* and the portal

from bench._server import Client, print_server_exceptions, serving
from bench.benchdb import (
    allow_booking_ahead,
    bulk_load,
    copy_reservations,
    create_lab,
    ensure_users,
    execute,
    open_database,
    percentile_ms,
    postgres_version,
    run_together,
)

# Booking over HTTP.
MAX_CLIENTS = 16
BOOK_NODE = "bench-api-book"
BOOK_USER_PREFIX = "bench-api-user-"
SLOT = timedelta(hours=1)
LEAD_TIME = timedelta(days=30)
HORIZON = timedelta(days=3650)
MAX_ERRORS_SHOWN = 5

# The read data set.
NODE_PREFIX = "bench-api-n"
NODE_COUNT = 25
GPUS_PER_NODE = 40
GPU_COUNT = NODE_COUNT * GPUS_PER_NODE
PER_GPU = 100
RESERVATION_COUNT = GPU_COUNT * PER_GPU
CELL = timedelta(days=1)  # each GPU has one reservation per day-long cell
OWNER_PREFIX = "bench-api-owner-"
OWNER_COUNT = 20
READER = "bench-api-reader"
GPU_MODELS = (("NVIDIA A100-SXM4-80GB", 81920), ("NVIDIA H100 80GB HBM3", 81559), ("NVIDIA L40S", 46068))
SEED = 20240601
READ_URLS = (
    "/api/v1/gpus/",
    "/api/v1/gpus/?limit=1000",
    "/api/v1/reservations/?limit=100",
    "/api/v1/availability/?gpus=2&hours=4",
)


def calendar_urls(now: datetime) -> tuple[str, ...]:
    """The calendar data the calendar page loads around ``now`` (UTC): today's day view of every GPU, this
    week's view of one node (40 GPUs), and this week of every GPU (1,000 rows, about 7,000 bookings)."""
    day = now.replace(hour=0, minute=0, second=0, microsecond=0)
    week = day - timedelta(days=day.weekday())

    def url(start: datetime, days: int, node: str = "") -> str:
        end = start + timedelta(days=days)
        return f"/api/v1/calendar/?start={start:%Y-%m-%dT%H:%M:%SZ}&end={end:%Y-%m-%dT%H:%M:%SZ}{node}"

    return url(day, 1), url(week, 7, f"&node={NODE_PREFIX}00"), url(week, 7)


def suggest_urls(now: datetime) -> tuple[str, ...]:
    """Suggestions from tomorrow 10:00 UTC: for 2 GPUs, 4 hours (room is found near), and for a whole node
    (40 GPUs), 8 hours, which every GPU's daily booking leaves almost no room for: every candidate start of
    the 8 days around it is tried on every node. Both read the past 8 weeks' demand once an hour (cached)."""
    start = now.replace(hour=10, minute=0, second=0, microsecond=0) + timedelta(days=1)
    url = "/api/v1/availability/suggest/?gpus={}&hours={}&start=" + f"{start:%Y-%m-%dT%H:%M:%SZ}"
    return url.format(2, 4), url.format(40, 8)


# --- results --------------------------------------------------------------------------------


@dataclass
class ClientResult:
    """What one client thread got back."""

    latencies: list[float] = field(default_factory=list)
    statuses: Counter[str] = field(default_factory=Counter)
    bodies: list[str] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)


@dataclass
class Row:
    """One line of the table: one kind of request at one concurrency."""

    request: str
    clients: int
    elapsed: float
    latencies: list[float]
    statuses: Counter[str]
    bodies: list[str]
    sizes: list[int]

    @property
    def ok(self) -> int:
        return len(self.latencies)

    @property
    def rate(self) -> float:
        return self.ok / self.elapsed if self.elapsed > 0 else 0.0

    def percentile_ms(self, pct: float) -> float:
        """Nearest-rank percentile of the successful requests' latency, in milliseconds."""
        return percentile_ms(self.latencies, pct)

    @property
    def errors(self) -> str:
        return ", ".join(f"{status}x{count}" for status, count in sorted(self.statuses.items())) or "-"


def combine(request: str, elapsed: float, results: list[ClientResult]) -> Row:
    return Row(
        request=request,
        clients=len(results),
        elapsed=elapsed,
        latencies=[latency for r in results for latency in r.latencies],
        statuses=sum((r.statuses for r in results), Counter()),
        bodies=[body for r in results for body in r.bodies],
        sizes=[size for r in results for size in r.sizes],
    )


@dataclass(frozen=True)
class Lane:
    """One booking client: its token and its own GPU."""

    token: str
    gpu_id: int


# --- setup ----------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each booking run (default 10)")
    parser.add_argument("--clients", default="1,16", help="comma-separated booking concurrency (default 1,16)")
    parser.add_argument("--requests", type=int, default=50, help="timed requests per read URL (default 50)")
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="booking runs per client count (default 1); with more, their spread is printed: on a shared "
        "2-core machine one run's p99 can be half or twice the next one's",
    )
    parser.add_argument("--rebuild", action="store_true", help="load the 100,000-reservation data set anew")
    parser.add_argument("--port", type=int, default=0, help="port for the server (default: a free one)")
    parser.add_argument(
        "--web-processes",
        type=int,
        default=0,
        help="the production server, gunicorn with this many uvicorn workers (default 0: one daphne, as scripts/run)",
    )
    args = parser.parse_args(argv)
    args.levels = [int(part) for part in args.clients.split(",") if part.strip()]
    if args.seconds <= 0 or args.requests < 1 or args.repeat < 1 or not args.levels:
        parser.error("--seconds, --requests and --repeat must be positive and --clients not empty")
    if min(args.levels) < 1 or max(args.levels) > MAX_CLIENTS:
        parser.error(f"each client count must be between 1 and {MAX_CLIENTS}")
    return args


def new_token(user: Any) -> str:
    from accounts.services import api_token_create

    _record, token = api_token_create(user=user, name="bench/api.py")
    return token


def clear_side_tables() -> None:
    """No limits, maintenance, old bench tokens or audit entries get in the way or pile up; one
    site-wide Limit lets the booking clients walk as far ahead as HORIZON (the site ceiling
    MAX_DAYS_AHEAD would refuse them after 90 days)."""
    from accounts.models import ApiToken
    from audit.models import AuditEntry
    from reservations.models import Limit, MaintenanceWindow

    Limit.objects.all().delete()
    allow_booking_ahead(HORIZON.days + 1)
    MaintenanceWindow.objects.all().delete()
    ApiToken.objects.filter(user__username__startswith="bench-api-").delete()
    execute(f"TRUNCATE {AuditEntry._meta.db_table}")


def drop_booking_node() -> None:
    """Delete the booking node with its GPUs and bookings (so the read data set is alone)."""
    from nodes.models import Node

    node = Node.objects.filter(name=BOOK_NODE).first()
    if node is None:
        return
    execute(
        "DELETE FROM reservations_allocation WHERE gpu_id IN (SELECT id FROM nodes_gpu WHERE node_id = %s)", [node.pk]
    )
    execute("DELETE FROM reservations_reservation WHERE node_id = %s", [node.pk])
    node.delete()


def create_booking_lanes(clients: int) -> list[Lane]:
    """A fresh booking node with one GPU per client; each client its own user and token."""
    from nodes.models import Gpu, Node

    drop_booking_node()
    node = Node.objects.create(name=BOOK_NODE, hostname=f"{BOOK_NODE}.example", requires_approval=False)
    gpus = Gpu.objects.bulk_create(
        Gpu(node=node, index=i, uuid=f"GPU-b00c{i:04x}-0000-4000-8000-000000000000", model="Bench", memory_mib=81920)
        for i in range(clients)
    )
    users = ensure_users(BOOK_USER_PREFIX, MAX_CLIENTS)[:clients]
    return [Lane(token=new_token(user), gpu_id=gpu.pk) for user, gpu in zip(users, gpus, strict=True)]


# --- the read data set ----------------------------------------------------------------------


def data_set_present(now: datetime) -> bool:
    """1,000 bench GPUs, 100,000 reservations on them, and some still upcoming a week from now."""
    from nodes.models import Gpu
    from reservations.models import Allocation, Reservation

    gpus = Gpu.objects.filter(node__name__startswith=NODE_PREFIX)
    reservations = Reservation.objects.filter(node__name__startswith=NODE_PREFIX)
    upcoming = Allocation.objects.filter(gpu__node__name__startswith=NODE_PREFIX, start__gt=now + timedelta(days=7))
    return gpus.count() == GPU_COUNT and reservations.count() == RESERVATION_COUNT and upcoming.exists()


def wipe_everything() -> None:
    """Empty the booking tables and delete every node and GPU (a rebuild starts from nothing)."""
    from nodes.models import Gpu, Node

    execute("TRUNCATE reservations_allocation, reservations_reservation RESTART IDENTITY CASCADE")
    Gpu.objects.all().delete()
    Node.objects.all().delete()


def create_nodes() -> list[tuple[int, int]]:
    """NODE_COUNT nodes with GPUS_PER_NODE GPUs each; returns (node id, gpu id) per GPU."""
    return create_lab([f"{NODE_PREFIX}{n:02d}" for n in range(NODE_COUNT)], GPUS_PER_NODE, GPU_MODELS)


def reservation_rows(
    gpus: list[tuple[int, int]], owner_ids: list[int], now: datetime
) -> Iterator[tuple[int, int, int, datetime, datetime]]:
    """(user id, node id, gpu id, start, end): PER_GPU per GPU, one in each day-long cell from
    PER_GPU/2 days before ``now``, 1 to 20 hours long on the 15-minute grid, so never overlapping.
    ``now`` falls in the middle of a cell, so a good share of the GPUs are held right now."""
    rng = random.Random(SEED)
    first = now.replace(minute=0, second=0, microsecond=0) - CELL * (PER_GPU // 2) - CELL / 2
    quarter = timedelta(minutes=15)
    for node_id, gpu_id in gpus:
        for cell in range(PER_GPU):
            length = rng.randint(4, 80) * quarter
            start = first + cell * CELL + rng.randint(0, int((CELL - length) / quarter)) * quarter
            yield rng.choice(owner_ids), node_id, gpu_id, start, start + length


def ensure_data_set(url: str, rebuild: bool) -> str:
    """Load the read data set unless it is there; returns what was done, for the report."""
    now = datetime.now(UTC)
    if not rebuild and data_set_present(now):
        return "data set already there"
    began = time.perf_counter()
    wipe_everything()
    owners = ensure_users(OWNER_PREFIX, OWNER_COUNT)
    gpus = create_nodes()
    rows = [
        (user_id, node_id, gpu_id, start, end, "approved", "", start - CELL)
        for user_id, node_id, gpu_id, start, end in reservation_rows(gpus, [owner.pk for owner in owners], now)
    ]
    with bulk_load(url) as cursor:
        copy_reservations(cursor, rows)
    return f"data set loaded in {time.perf_counter() - began:.1f} s"


def data_set_summary() -> str:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            """SELECT count(*) FILTER (WHERE start <= now() AND "end" > now()),
                      count(*) FILTER (WHERE start > now()), count(*) FILTER (WHERE "end" <= now())
               FROM reservations_allocation WHERE active"""
        )
        current, upcoming, past = cursor.fetchone()
    return f"allocations: {current} current, {upcoming} upcoming, {past} past"


# --- HTTP clients ---------------------------------------------------------------------------


def timed(client: Client, result: ClientResult, expect: int, method: str, path: str, payload: Any = None) -> None:
    """Send one request and record its latency (if it answered ``expect``) or its failure."""
    began = time.perf_counter()
    try:
        status, body = client.send(method, path, payload)
    except (OSError, http.client.HTTPException) as exc:
        result.statuses[type(exc).__name__] += 1
        return
    elapsed = time.perf_counter() - began
    if status == expect:
        result.latencies.append(elapsed)
        result.sizes.append(len(body))
        return
    result.statuses[str(status)] += 1
    if len(result.bodies) < MAX_ERRORS_SHOWN:
        result.bodies.append(f"{status}: {body[:500].decode(errors='replace')}")


# --- booking over HTTP ----------------------------------------------------------------------


def slots(now: datetime) -> Iterator[tuple[datetime, datetime]]:
    """Hour-long slots, back to back, on the hour from LEAD_TIME ahead up to HORIZON."""
    first = now.astimezone(UTC).replace(minute=0, second=0, microsecond=0) + LEAD_TIME
    for step in range(int((HORIZON - LEAD_TIME) / SLOT)):
        start = first + step * SLOT
        yield start, start + SLOT


def booking_run(port: int, lanes: list[Lane], seconds: float) -> Row:
    """One thread per lane, all starting together, each booking back to back for ``seconds``."""
    results = [ClientResult() for _ in lanes]
    workers = [partial(book_lane, port, lane, result, seconds) for lane, result in zip(lanes, results, strict=True)]
    return combine("POST /api/v1/reservations/", run_together(workers), results)


def book_lane(port: int, lane: Lane, result: ClientResult, seconds: float, ready: Callable[[], float]) -> None:
    client = Client(port, lane.token)
    try:
        deadline = ready() + seconds
        for start, end in slots(datetime.now(UTC)):
            if time.perf_counter() >= deadline:
                return
            payload = {"gpus": [lane.gpu_id], "start": start.isoformat(), "end": end.isoformat()}
            timed(client, result, 201, "POST", "/api/v1/reservations/", payload)
    finally:
        client.close()


# --- reads ----------------------------------------------------------------------------------


def read_run(port: int, token: str, path: str, count: int) -> Row:
    """``count`` sequential GETs of ``path`` on one connection, after one untimed warm-up."""
    client = Client(port, token)
    result = ClientResult()
    try:
        timed(client, ClientResult(), 200, "GET", path)
        began = time.perf_counter()
        for _ in range(count):
            timed(client, result, 200, "GET", path)
        elapsed = time.perf_counter() - began
    finally:
        client.close()
    return combine(f"GET {path}", elapsed, [result])


# --- reporting ------------------------------------------------------------------------------


def report_errors(row: Row) -> None:
    if not row.statuses:
        return
    print(f"{row.request}, {row.clients} clients: {sum(row.statuses.values())} errors ({row.errors})")
    for body in row.bodies[:MAX_ERRORS_SHOWN]:
        print(f"  {body}")


def print_table(rows: list[Row]) -> None:
    headers = ["request", "clients", "ok", "ok/s", "p50 ms", "p99 ms", "KiB", "errors"]
    cells = [
        [
            row.request,
            str(row.clients),
            str(row.ok),
            f"{row.rate:.1f}",
            f"{row.percentile_ms(50):.1f}",
            f"{row.percentile_ms(99):.1f}",
            f"{sum(row.sizes) / len(row.sizes) / 1024:.1f}" if row.sizes else "-",
            row.errors,
        ]
        for row in rows
    ]
    widths = [max(len(cell) for cell in column) for column in zip(headers, *cells, strict=True)]
    for line in [headers, ["-" * width for width in widths], *cells]:
        first, *rest = line
        print(" | ".join([first.ljust(widths[0]), *(cell.rjust(w) for cell, w in zip(rest, widths[1:], strict=True))]))


def print_spread(rows: list[Row]) -> None:
    """For each client count booked more than once: the lowest, median and highest rate and p99 of its runs."""
    runs: dict[int, list[Row]] = {}
    for row in rows:
        if row.request.startswith("POST"):
            runs.setdefault(row.clients, []).append(row)
    repeated = {clients: group for clients, group in runs.items() if len(group) > 1}
    if not repeated:
        return
    print("\nbooking runs, lowest / median / highest:")
    for clients, group in repeated.items():
        rates = sorted(row.rate for row in group)
        p99s = sorted(row.percentile_ms(99) for row in group)
        print(
            f"  {clients:>2} clients, {len(group)} runs: {rates[0]:.1f} / {median(rates):.1f} / {rates[-1]:.1f} per s, "
            f"p99 {p99s[0]:.0f} / {median(p99s):.0f} / {p99s[-1]:.0f} ms"
        )


def print_context(args: argparse.Namespace, loaded: str) -> None:
    server = f"gunicorn, {args.web_processes} uvicorn workers" if args.web_processes else "daphne"
    print(
        f"API benchmark through {server}: booking {args.seconds:g} s per run (1-hour slots, 1 GPU per client), "
        f"reads {args.requests} sequential requests per URL over {GPU_COUNT} GPUs and {RESERVATION_COUNT:,} "
        f"reservations; PostgreSQL {postgres_version()}, {os.cpu_count()} CPUs"
    )
    print(f"{loaded}; {data_set_summary()}")


# --- main -----------------------------------------------------------------------------------


def run_benchmarks(args: argparse.Namespace, port: int, reader_token: str) -> list[Row]:
    now = datetime.now(UTC)
    paths = (*READ_URLS, *calendar_urls(now), *suggest_urls(now))
    rows = [read_run(port, reader_token, path, args.requests) for path in paths]
    for clients in args.levels:
        for _ in range(args.repeat):
            lanes = create_booking_lanes(clients)
            rows.append(booking_run(port, lanes, args.seconds))
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    url = open_database("bench/api.py", "portal_bench_api")
    clear_side_tables()
    drop_booking_node()
    loaded = ensure_data_set(url, args.rebuild)
    reader_token = new_token(ensure_users(READER, 1)[0])
    print_context(args, loaded)

    with tempfile.TemporaryFile() as log:
        with serving(url, args.port, log, args.web_processes) as (port, _log):
            rows = run_benchmarks(args, port, reader_token)
        print()
        for row in rows:
            report_errors(row)
        if any(status.startswith("5") for row in rows for status in row.statuses):
            print_server_exceptions(log, MAX_ERRORS_SHOWN)
    print_table(rows)
    print_spread(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
