"""The usage report over a year of 100 GPUs: how long each view takes to compute.

What it measures
    A lab of 10 nodes x 10 GPUs, booked for the whole past year by 30 researchers in 5 groups:
    on every GPU, bookings of 2 to 8 hours with gaps of 0 to 8 hours between them (about 110,000
    bookings), and a UsageHour row (accounting/) for every GPU-hour of the year (876,000 rows),
    attributed to the booking that held it, with a random share of used minutes and its energy (600 W busy,
    60 W idle), priced with an all-day tariff and an evening one (accounting.Tariff). Then, as an admin
    (who sees everyone), the report over the past 365 days by person, group, node and GPU, and the
    demand by hour of the week, each ``--repeat`` times after one warm-up: p50 and max.

    What a browser waits for on the reports page is one of these plus rendering the JSON.

How to run it
    It needs PostgreSQL and a database of its own, whose name contains "bench": every run empties
    its bookings, usage, nodes and GPUs and loads the year anew with COPY (about half a minute).

        DATABASE_URL=postgres://portal:portal@127.0.0.1:5432/portal_bench_reports .venv/bin/python bench/reports.py
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: bench.* and the portal

from bench.benchdb import (
    bulk_load,
    copy_reservations,
    create_lab,
    ensure_users,
    open_database,
    percentile_ms,
    reset_lab,
)

NODES, GPUS_PER_NODE, USERS, GROUPS = 10, 10, 30, 5
SEED = 8
BUSY_MJ_PER_MINUTE, IDLE_MJ_PER_MINUTE = 600 * 60 * 1000, 60 * 60 * 1000  # 600 W and 60 W for a minute


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="timed runs of each view (default 5)")
    return parser.parse_args(argv)


def people() -> tuple[list[int], Any]:
    """USERS researchers, in turn in GROUPS groups, and an admin; returns the researchers' ids and the admin."""
    from django.contrib.auth.models import Group

    groups = [Group.objects.get_or_create(name=f"bench-group-{g}")[0] for g in range(GROUPS)]
    users = ensure_users("bench-rep-", USERS)
    for i, user in enumerate(users):
        user.groups.set([groups[i % GROUPS]])
    admin = ensure_users("bench-rep-admin", 1, is_staff=True)[0]
    return [user.pk for user in users], admin


def load_year(url: str, now: datetime, user_ids: list[int]) -> tuple[int, int]:
    """Bookings (by ``user_ids``) and usage hours for the past year; returns their counts."""
    lab = create_lab([f"rep-{n}" for n in range(NODES)], GPUS_PER_NODE, [("NVIDIA H100 80GB HBM3", 81559)], "rp")
    rng = random.Random(SEED)
    first = (now - timedelta(days=366)).replace(minute=0, second=0, microsecond=0)
    bookings = []
    for node_id, gpu_id in lab:
        moment = first + timedelta(hours=rng.randrange(8))
        while moment < now:
            end = moment + timedelta(hours=rng.randrange(2, 9))
            start, stop = moment, min(end, now)
            bookings.append((rng.choice(user_ids), node_id, gpu_id, start, stop, "approved", "", start))
            moment = end + timedelta(hours=rng.randrange(0, 9))
    hours = 0
    with bulk_load(url) as cursor:
        ids = copy_reservations(cursor, bookings)
        with cursor.copy(
            "COPY accounting_usagehour (gpu_id, hour, reservation_id, user_id, minutes_reported, minutes_measured, "
            "used_minutes, utilization_sum, utilization_samples, memory_used_max_mib, energy_mj, idle_energy_mj, "
            "energy_estimated) FROM STDIN"
        ) as copy:
            for pk, (user_id, _node, gpu_id, start, end, *_rest) in zip(ids, bookings, strict=True):
                hour = start
                while hour < end:
                    used = rng.choice((0, 0, 15, 30, 45, 60, 60, 60))
                    idle_mj = (60 - used) * IDLE_MJ_PER_MINUTE
                    energy = used * BUSY_MJ_PER_MINUTE + idle_mj
                    row = (gpu_id, hour, pk, user_id, 60, 60, used, used * 12 * 80, 720, 40000, energy, idle_mj, False)
                    copy.write_row(row)
                    hour += timedelta(hours=1)
                    hours += 1
    return len(bookings), hours


def timed(label: str, run: Any, repeat: int) -> None:
    run()
    seconds = []
    for _ in range(repeat):
        started = time.perf_counter()
        result = run()
        seconds.append(time.perf_counter() - started)
    size = len(result.rows) if hasattr(result, "rows") else len(result)
    print(f"{label:<34} p50 {percentile_ms(seconds, 50):7.0f} ms   max {max(seconds) * 1000:7.0f} ms   ({size} rows)")


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    url = open_database("bench/reports.py", "portal_bench_reports")
    from accounting.report import demand_by_hour_of_week, usage_report

    now = datetime.now(UTC).replace(microsecond=0)
    reset_lab()
    started = time.perf_counter()
    user_ids, admin = people()
    bookings, hours = load_year(url, now, user_ids)
    from accounting.models import Tariff

    Tariff.objects.all().delete()
    Tariff.objects.create(name="day", price_per_kwh=Decimal("0.30"), co2_g_per_kwh=Decimal("380"))
    Tariff.objects.create(
        name="evening", price_per_kwh=Decimal("0.42"), co2_g_per_kwh=Decimal("450"), hour_from=17, hour_until=21
    )
    print(
        f"lab: {NODES * GPUS_PER_NODE} GPUs, {bookings:,} bookings and {hours:,} usage hours over the past year, "
        f"loaded in {time.perf_counter() - started:.0f} s"
    )
    start = now - timedelta(days=365)
    for by in ("user", "group", "node", "gpu"):
        timed(
            f"a year's report by {by}",
            lambda by=by: usage_report(start=start, end=now, by=by, viewer=admin),
            args.repeat,
        )
    timed(
        "a year's demand by hour of the week",
        lambda: demand_by_hour_of_week(start=start, end=now, viewer=admin, zone="Europe/Berlin"),
        args.repeat,
    )


if __name__ == "__main__":
    main()
