"""The booking calendar's data endpoint on a full lab: GET /api/v1/calendar/ latency and size.

What it measures
    A lab of 8 nodes x 8 GPUs = 64 GPUs, booked densely: two-hour slots back to back on every GPU
    through the whole current week (Monday 00:00 UTC to the next Monday, 84 slots a GPU, 5,376
    reservations), each held by one of 16 users, every 7th one pending, plus two maintenance
    windows. Behind that week lie ``--history-weeks`` (default 12) more weeks booked the same way,
    so the range query is measured with history in the tables it must skip, as in a real lab.

    One researcher asks for the calendar of that week (what the week view loads), of one day of it
    (the day view), and of the week of one node (``&node=``), each ``--requests`` times after one
    warm-up request, sequentially:

    1. in-process, through Django's test client: the view's own cost (queries, building the
       events, JSON rendering), no HTTP;
    2. over HTTP to daphne (``portal.asgi:application``, started by bench/_server.py, DEBUG=0), one
       keep-alive connection with an API token, once plain and once with ``Accept-Encoding: gzip``
       as browsers send it (the endpoint compresses): what a browser waits for.

    Reported: p50 and p99 latency, and the size of the answer as sent, in KiB.

How to run it
    It needs PostgreSQL and a database of its own, whose name contains "bench": every run deletes
    every node, GPU, booking, maintenance window and limit in it and loads the lab anew (with COPY,
    a few seconds).

        DATABASE_URL=postgres://portal:portal@127.0.0.1:5432/portal_bench_cal .venv/bin/python bench/calendar_data.py
        ... bench/calendar_data.py --requests 100 --history-weeks 52

    The database is created if it is missing and migrated. The data stays behind after the run.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: bench.* and the portal

from bench._server import Client, serving
from bench.benchdb import (
    BookingRow,
    bulk_load,
    copy_reservations,
    create_lab,
    ensure_users,
    open_database,
    percentile_ms,
    reset_lab,
)

NODE_COUNT = 8
GPUS_PER_NODE = 8
GPU_COUNT = NODE_COUNT * GPUS_PER_NODE
SLOT = timedelta(hours=2)
WEEK = timedelta(days=7)
USER_PREFIX = "bench-cal-user-"
USER_COUNT = 16
READER = "bench-cal-reader"
PENDING_EVERY = 7
GPU_MODELS = (("NVIDIA A100-SXM4-80GB", 81920), ("NVIDIA H100 80GB HBM3", 81559), ("NVIDIA L40S", 46068))
PURPOSES = ("fine-tuning", "protein folding sweep", "ablation study", "thesis experiments", "")
SEED = 20261203


@dataclass
class Row:
    """One line of the table: one request, one way."""

    request: str
    way: str
    latencies: list[float]
    size: int
    events: int

    def percentile_ms(self, pct: float) -> float:
        return percentile_ms(self.latencies, pct)


# --- setup ----------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=50, help="timed requests per URL and way (default 50)")
    parser.add_argument(
        "--history-weeks", type=int, default=12, help="weeks of equally dense bookings before this one (default 12)"
    )
    parser.add_argument("--no-http", action="store_true", help="measure in-process only (no daphne)")
    args = parser.parse_args(argv)
    if args.requests < 1 or args.history_weeks < 0:
        parser.error("--requests must be positive and --history-weeks not negative")
    return args


def week_start(now: datetime) -> datetime:
    """Monday 00:00 UTC of the week holding ``now``."""
    midnight = now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return midnight - timedelta(days=midnight.weekday())


def booking_rows(
    gpus: list[tuple[int, int]], owner_ids: list[int], first: datetime, weeks: int
) -> Iterator[BookingRow]:
    """SLOT-long bookings back to back on every GPU, each made a week before it starts."""
    rng = random.Random(SEED)
    per_gpu = int(weeks * WEEK / SLOT)
    for node_id, gpu_id in gpus:
        for step in range(per_gpu):
            start = first + step * SLOT
            status = "pending" if rng.randrange(PENDING_EVERY) == 0 else "approved"
            owner, purpose = rng.choice(owner_ids), rng.choice(PURPOSES)
            yield owner, node_id, gpu_id, start, start + SLOT, status, purpose, start - WEEK


def load_lab(url: str, history_weeks: int, now: datetime) -> tuple[Any, datetime]:
    """The whole data set; returns the reader and the start of the measured week."""
    from nodes.models import Gpu, Node
    from reservations.models import MaintenanceWindow

    reset_lab()
    owners = ensure_users(USER_PREFIX, USER_COUNT)
    reader = ensure_users(READER, 1)[0]
    gpus = create_lab([f"bench-cal-n{n}" for n in range(NODE_COUNT)], GPUS_PER_NODE, GPU_MODELS, uuid_tag="ca1e")
    monday = week_start(now)
    rows = list(booking_rows(gpus, [owner.pk for owner in owners], monday - history_weeks * WEEK, history_weeks + 1))
    with bulk_load(url) as cursor:
        copy_reservations(cursor, rows)
    node = Node.objects.order_by("name").first()
    wednesday = monday + timedelta(days=2)
    MaintenanceWindow.objects.create(node=node, start=wednesday, end=wednesday + timedelta(hours=6), reason="BIOS")
    gpu = Gpu.objects.filter(node__name="bench-cal-n1", index=3).get()
    MaintenanceWindow.objects.create(
        node=gpu.node, gpu=gpu, start=monday + timedelta(days=4), end=monday + timedelta(days=5), reason="fan"
    )
    return reader, monday


def new_token(user: Any) -> str:
    from accounts.models import ApiToken
    from accounts.services import api_token_create

    ApiToken.objects.filter(user=user).delete()
    _record, token = api_token_create(user=user, name="bench/calendar_data.py")
    return token


# --- measuring ------------------------------------------------------------------------------


def requests_to_time(monday: datetime) -> list[tuple[str, str]]:
    """(label, path) of the ranges the page loads: the week view, a day view, one node's week."""
    week = {"start": monday.isoformat(), "end": (monday + WEEK).isoformat()}
    wednesday = monday + timedelta(days=2)
    day = {"start": wednesday.isoformat(), "end": (wednesday + timedelta(days=1)).isoformat()}
    return [
        ("week, all 64 GPUs", f"/api/v1/calendar/?{urlencode(week)}"),
        ("day, all 64 GPUs", f"/api/v1/calendar/?{urlencode(day)}"),
        ("week, one node", f"/api/v1/calendar/?{urlencode({**week, 'node': 'bench-cal-n2'})}"),
    ]


def measure(label: str, way: str, get: Callable[[], tuple[int, bytes]], count: int) -> Row:
    status, body = get()  # warm-up, untimed
    if status != 200:
        raise RuntimeError(f"{label} ({way}) answered {status}: {body[:500]!r}")
    latencies = []
    for _ in range(count):
        began = time.perf_counter()
        status, body = get()
        latencies.append(time.perf_counter() - began)
        if status != 200:
            raise RuntimeError(f"{label} ({way}) answered {status}: {body[:500]!r}")
    events = json.loads(gzip.decompress(body) if body[:2] == b"\x1f\x8b" else body)["events"]
    bookings = sum(1 for event in events if event["extendedProps"]["kind"] == "reservation")
    return Row(label, way, latencies, len(body), bookings)


def in_process_rows(token: str, paths: list[tuple[str, str]], count: int) -> list[Row]:
    from django.test import Client

    client = Client(HTTP_AUTHORIZATION=f"Bearer {token}", HTTP_HOST="127.0.0.1")

    def getter(path: str) -> Callable[[], tuple[int, bytes]]:
        def get() -> tuple[int, bytes]:
            response = client.get(path)
            return response.status_code, response.content

        return get

    return [measure(label, "in-process", getter(path), count) for label, path in paths]


def http_rows(url: str, token: str, paths: list[tuple[str, str]], count: int) -> list[Row]:
    with serving(url) as (port, _log):
        client = Client(port, token)
        try:
            rows = [measure(label, "daphne", _http_getter(client, path), count) for label, path in paths]
            client.headers["Accept-Encoding"] = "gzip"
            return rows + [measure(label, "daphne, gzip", _http_getter(client, path), count) for label, path in paths]
        finally:
            client.close()


def _http_getter(client: Client, path: str) -> Callable[[], tuple[int, bytes]]:
    return lambda: client.send("GET", path)


# --- reporting ------------------------------------------------------------------------------


def print_table(rows: list[Row]) -> None:
    headers = ["request", "way", "bookings", "p50 ms", "p99 ms", "KiB sent"]
    cells = [
        [
            row.request,
            row.way,
            str(row.events),
            f"{row.percentile_ms(50):.1f}",
            f"{row.percentile_ms(99):.1f}",
            f"{row.size / 1024:.0f}",
        ]
        for row in rows
    ]
    widths = [max(len(cell) for cell in column) for column in zip(headers, *cells, strict=True)]
    for line in [headers, ["-" * width for width in widths], *cells]:
        first, second, *rest = line
        print(
            " | ".join(
                [
                    first.ljust(widths[0]),
                    second.ljust(widths[1]),
                    *(cell.rjust(w) for cell, w in zip(rest, widths[2:], strict=True)),
                ]
            )
        )


def print_context(args: argparse.Namespace, monday: datetime, loaded: float) -> None:
    from django.db import connection

    from reservations.models import Reservation

    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        (version,) = cursor.fetchone()
    total = Reservation.objects.count()
    print(
        f"calendar benchmark: {NODE_COUNT} nodes x {GPUS_PER_NODE} GPUs, {SLOT.seconds // 3600}-hour bookings back "
        f"to back in the week of {monday:%Y-%m-%d} and {args.history_weeks} weeks before it ({total:,} reservations "
        f"in all, loaded in {loaded:.1f} s); {args.requests} sequential requests per URL after a warm-up; "
        f"PostgreSQL {version}, {os.cpu_count()} CPUs"
    )


# --- main -----------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    url = open_database("bench/calendar_data.py", "portal_bench_calendar")
    began = time.perf_counter()
    reader, monday = load_lab(url, args.history_weeks, datetime.now(UTC))
    print_context(args, monday, time.perf_counter() - began)
    token = new_token(reader)
    paths = requests_to_time(monday)
    rows = in_process_rows(token, paths, args.requests)
    if not args.no_http:
        from django.db import connection

        connection.close()  # the server gets the database to itself
        rows += http_rows(url, token, paths, args.requests)
    print()
    print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
