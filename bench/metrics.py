"""/metrics on a large fleet: how long one Prometheus scrape takes, and how big it is.

What it measures
    A fleet of 100 nodes x 8 GPUs = 800 GPUs, every agent reporting and every GPU with a fresh
    reading (two processes each); three GPUs in four held by a running booking and each with one
    upcoming booking after it, every 7th booking pending (so ~1,400 live bookings, and pending
    approvals); a few nodes offline and a few GPUs drained, so every kind of series is there.

    GET /metrics with the bearer token, ``--requests`` times after one warm-up, in-process through
    Django's test client (the view's whole cost: five queries, building the series, rendering the
    text format; no HTTP). Reported: p50 and p99 latency, the body's size and its number of series.

How to run it
    It needs PostgreSQL and a database of its own, whose name contains "bench": every run deletes
    every node, GPU and booking in it and loads the fleet anew (a few seconds).

        DATABASE_URL=postgres://portal:portal@127.0.0.1:5432/portal_bench_metrics .venv/bin/python bench/metrics.py
        ... bench/metrics.py --nodes 200 --requests 100

    The database is created if it is missing and migrated. The data stays behind after the run.
    AGENT_OFFLINE_AFTER_SECONDS is set to an hour for the run, so readings stay fresh (exported)
    however long it takes.
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: bench.* and the portal

from bench.benchdb import create_lab, ensure_users, execute, open_database, percentile_ms, postgres_version, reset_lab

GPUS_PER_NODE = 8
USER_PREFIX = "bench-metrics-user-"
USER_COUNT = 16
PENDING_EVERY = 7
OFFLINE_EVERY = 25  # every 25th node's agent went silent
DRAINED_EVERY = 97  # every 97th GPU is drained
GPU_MODELS = (("NVIDIA A100-SXM4-80GB", 81920), ("NVIDIA H100 80GB HBM3", 81559), ("NVIDIA L40S", 46068))
TOKEN = secrets.token_urlsafe(32)  # this run's METRICS_TOKEN


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=100, help="nodes of 8 GPUs (default 100)")
    parser.add_argument("--requests", type=int, default=50, help="timed scrapes (default 50)")
    args = parser.parse_args(argv)
    if args.nodes < 1 or args.requests < 1:
        parser.error("--nodes and --requests must be positive")
    return args


def load_fleet(node_count: int, now: datetime) -> None:
    from nodes.models import WHOLE_CARD, AgentState, Gpu, GpuTelemetry, Node
    from reservations.models import Allocation, Reservation

    reset_lab()
    users = ensure_users(USER_PREFIX, USER_COUNT)
    gpus = create_lab([f"bench-met-n{n:03d}" for n in range(node_count)], GPUS_PER_NODE, GPU_MODELS, uuid_tag="3e7")
    nodes = list(Node.objects.order_by("name"))
    Node.objects.update(lease_version=12)
    AgentState.objects.bulk_create(
        AgentState(
            node=node,
            last_seen=now - (timedelta(hours=2) if n % OFFLINE_EVERY == 0 else timedelta(seconds=3)),
            agent_version="0.3.0",
            backend="nvml",
            driver_version="550.54.15",
            applied_version=12 - n % 3,
            clock_skew_seconds=0.01 * (n % 7),
        )
        for n, node in enumerate(nodes)
    )
    GpuTelemetry.objects.bulk_create(
        GpuTelemetry(
            gpu_id=gpu_id,
            at=now - timedelta(seconds=2),
            utilization_pct=(i * 37) % 101,
            memory_used_mib=(i * 997) % 40000,
            memory_total_mib=81920,
            temperature_c=35 + i % 50,
            slowdown_temperature_c=90,
            power_w=60.0 + i % 300,
            ecc_errors_uncorrected=0,
            processes=[{"pid": 1000 + i, "user": "u", "used_memory_mib": 100}, {"pid": 2000 + i, "user": "v"}],
        )
        for i, (_node_id, gpu_id) in enumerate(gpus)
    )
    Gpu.objects.filter(pk__in=[gpu_id for i, (_n, gpu_id) in enumerate(gpus) if i % DRAINED_EVERY == 0]).update(
        drained_at=now, drain_reason="bench"
    )
    slots = []
    for i, (node_id, gpu_id) in enumerate(gpus):
        if i % 4 == 3:
            continue
        slots.append((node_id, gpu_id, now - timedelta(hours=1), now + timedelta(hours=1)))
        slots.append((node_id, gpu_id, now + timedelta(hours=2), now + timedelta(hours=4)))
    reservations = Reservation.objects.bulk_create(
        Reservation(
            user=users[i % USER_COUNT],
            node_id=node_id,
            start=start,
            end=end,
            status=Reservation.Status.PENDING if i % PENDING_EVERY == 0 else Reservation.Status.APPROVED,
            created_at=start - timedelta(days=1),
        )
        for i, (node_id, _gpu, start, end) in enumerate(slots)
    )
    Allocation.objects.bulk_create(
        # Whole cards: the card is the GPU, the placement all of it.
        Allocation(
            reservation=reservation,
            gpu_id=gpu_id,
            card_id=gpu_id,
            placement_start=0,
            placement_end=WHOLE_CARD,
            start=start,
            end=end,
        )
        for reservation, (_node, gpu_id, start, end) in zip(reservations, slots, strict=True)
    )
    execute("ANALYZE")


def measure(count: int) -> tuple[list[float], bytes]:
    from django.test import Client

    client = Client(HTTP_HOST="127.0.0.1", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    warm = client.get("/metrics")
    if warm.status_code != 200:
        raise RuntimeError(f"/metrics answered {warm.status_code}: {warm.content[:500]!r}")
    latencies = []
    for _ in range(count):
        began = time.perf_counter()
        response = client.get("/metrics")
        latencies.append(time.perf_counter() - began)
        if response.status_code != 200:
            raise RuntimeError(f"/metrics answered {response.status_code}: {response.content[:500]!r}")
    return latencies, response.content


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ["AGENT_OFFLINE_AFTER_SECONDS"] = "3600"
    os.environ["METRICS_TOKEN"] = TOKEN
    open_database("bench/metrics.py", "portal_bench_metrics")
    began = time.perf_counter()
    load_fleet(args.nodes, datetime.now(UTC))
    loaded = time.perf_counter() - began
    latencies, body = measure(args.requests)
    series = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
    print(
        f"/metrics benchmark: {args.nodes} nodes x {GPUS_PER_NODE} GPUs (loaded in {loaded:.1f} s), "
        f"{args.requests} sequential scrapes in-process after a warm-up; "
        f"PostgreSQL {postgres_version()}, {os.cpu_count()} CPUs"
    )
    print(
        f"one scrape: p50 {percentile_ms(latencies, 50):.1f} ms, p99 {percentile_ms(latencies, 99):.1f} ms; "
        f"{len(body) / 1024:.0f} KiB, {series:,} series"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
