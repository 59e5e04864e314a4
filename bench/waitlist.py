"""What the waitlist adds to a cancellation: the freed slot is offered inside the cancelling transaction.

What it measures
    A node of 8 GPUs, every one booked for the same two hours by a holder. N researchers wait (0, 32, 256 by
    default) for "any 1 GPU of the node, 2 hours, in that window", and a quarter of them used GPUs in the past
    days (so the fair-share order is not the arrival order). Then the holder cancels one booking after another,
    8 in all, each in its own transaction, as reservation_cancel does: the first waiter in line gets the GPU
    (auto-booked right after the commit). For each N: the p50 and p99 milliseconds of one cancellation (its
    transaction, with the offer, and the after-commit booking), and the queries it ran.

How to run it
    PostgreSQL, and a database of its own whose name contains "bench" (it empties the booking tables):

        DATABASE_URL=postgres://portal:portal@127.0.0.1:5432/portal_bench REDIS_URL=redis://127.0.0.1:6379/9 \
            .venv/bin/python bench/waitlist.py
        ... bench/waitlist.py --waiters 0,32,256 --rounds 3
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: bench.* and the portal

from bench.benchdb import allow_booking_ahead, create_lab, ensure_users, open_database, percentile_ms, reset_lab

GPUS = 8


def one_round(waiters: int) -> tuple[list[float], list[int], int]:
    """Latencies (s) and query counts of the 8 cancellations, and how many waiters got a GPU."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext
    from django.utils import timezone

    from nodes.models import Gpu, Node
    from reservations.models import Allocation, Reservation
    from reservations.services import reservation_cancel, reservation_create
    from reservations.timegrid import floor_to_grid
    from waitlist.models import Entry
    from waitlist.services import Want, entry_join

    reset_lab()
    Entry.objects.all().delete()
    allow_booking_ahead(30)
    lab = create_lab(["bench-waitlist"], GPUS, [("NVIDIA H100", 81920)], uuid_tag="wl")
    past_lab = create_lab(["bench-past"], 4, [("NVIDIA H100", 81920)], uuid_tag="wp")
    holder = ensure_users("bench-holder", 1, is_staff=True)[0]
    people = ensure_users("bench-waiter-", waiters)

    node = Node.objects.get(name="bench-waitlist")
    start = floor_to_grid(timezone.now()) + timedelta(days=1)
    end = start + timedelta(hours=2)
    taken = [reservation_create(user=holder, gpus=[gpu_id], start=start, end=end) for _, gpu_id in lab]
    past_gpus = [Gpu.objects.get(pk=gpu_id) for _, gpu_id in past_lab]
    for i, person in enumerate(people[: waiters // 4]):  # some used GPUs lately: a lower fair-share factor
        at = timezone.now() - timedelta(days=2, hours=3 * i)
        booking = Reservation.objects.create(
            user=person, node=past_gpus[0].node, start=at, end=at + timedelta(hours=2), status="approved"
        )
        Allocation.objects.create(reservation=booking, gpu=past_gpus[i % 4], start=booking.start, end=booking.end)
    want = Want(node=node, count=1, earliest_start=start, latest_end=end, duration=timedelta(hours=2))
    for person in people:
        entry_join(user=person, want=want)
    latencies, queries = [], []
    for booking in taken:
        with CaptureQueriesContext(connection) as captured:
            began = time.perf_counter()
            reservation_cancel(reservation=booking, actor=holder)
            latencies.append(time.perf_counter() - began)
        queries.append(len(captured.captured_queries))
    served = Entry.objects.filter(status=Entry.Status.BOOKED).count()
    return latencies, queries, served


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--waiters", default="0,32,256", help="waiting entries, comma-separated")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of 8 cancellations per figure")
    args = parser.parse_args()
    open_database("bench/waitlist.py", "portal_bench")
    print(f"{'waiters':>8} {'p50 ms':>8} {'p99 ms':>8} {'queries':>8} {'served':>7}")
    for waiters in (int(part) for part in args.waiters.split(",")):
        latencies: list[float] = []
        queries: list[int] = []
        served = 0
        for _ in range(args.rounds):
            took, counted, got = one_round(waiters)
            latencies += took
            queries += counted
            served += got
        print(
            f"{waiters:>8} {percentile_ms(latencies, 50):>8.1f} {percentile_ms(latencies, 99):>8.1f} "
            f"{max(queries):>8} {served // args.rounds:>7}"
        )


if __name__ == "__main__":
    main()
