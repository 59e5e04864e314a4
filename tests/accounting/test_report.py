"""The usage report on known data: bookings, minutes of telemetry, the rollup, then the figures."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError

from accounting.models import Tariff, UsageHour
from accounting.report import demand_by_hour_of_week, usage_report
from accounting.rollup import rollup, rollup_recent
from nodes.models import GpuMinute, Node
from reservations.models import MaintenanceWindow
from reservations.services import reservation_create, reservation_release
from tests.conftest import at
from tests.factories import book, carve_mig, node_with_gpus

pytestmark = pytest.mark.usefixtures("clock")
DAY_START, DAY_END = at(-9), at(15)  # Monday 2030-01-07, 00:00 to 24:00 UTC


def minutes(gpu, first, count, utilization, energy_mj=None, estimated=False):
    """``count`` minutes of readings from ``first``; ``utilization`` None: readings without one, as a MIG slice on a
    card without GPM sends; ``energy_mj`` a minute's energy, if any."""
    measured = 0 if utilization is None else 12
    GpuMinute.objects.bulk_create(
        GpuMinute(
            gpu=gpu,
            minute=first + timedelta(minutes=i),
            samples=12,
            utilization_samples=measured,
            utilization_sum=measured * (utilization or 0),
            memory_used_max_mib=1000,
            energy_mj=energy_mj,
            energy_estimated=estimated,
        )
        for i in range(count)
    )


@pytest.fixture
def day(clock, alice, bob, carol, gpus):
    """Monday: alice uses one of her two GPUs for one of two hours, releases a later booking
    half-way (after using it); bob books four hours and never uses them; carol's booking has no
    readings at all (so nobody can tell). Energy: alice's busy GPU draws 300 W, her idle one 60 W;
    bob's idle one 30 W, estimated; her later booking's card keeps no counter."""
    vision, nlp = Group.objects.create(name="vision"), Group.objects.create(name="nlp")
    alice.groups.add(vision)
    bob.groups.add(vision, nlp)
    both = book(alice, gpus[:2], at(1), at(3))  # 10:00-12:00
    idle = book(bob, [gpus[2]], at(4), at(8))  # 13:00-17:00
    unknown = book(carol, [gpus[3]], at(1), at(2))  # 10:00-11:00
    later = book(alice, [gpus[3]], at(5), at(7))  # 14:00-16:00
    minutes(gpus[0], at(1), 60, utilization=80, energy_mj=18_000_000)  # 300 W x 60 s
    minutes(gpus[1], at(1), 120, utilization=2, energy_mj=3_600_000)  # under the 10 % threshold
    minutes(gpus[2], at(4), 240, utilization=0, energy_mj=1_800_000, estimated=True)
    minutes(gpus[3], at(5), 60, utilization=50)
    minutes(gpus[2], at(10), 30, utilization=99)  # 19:00: nobody's booking
    clock.move_to(at(6))  # 15:00
    reservation_release(reservation=later, actor=alice)
    clock.move_to(at(11))  # 20:00, everything over
    rollup(since=DAY_START, until=at(11))
    return {"both": both, "idle": idle, "unknown": unknown, "later": later}


def by_label(report):
    return {row.label: row.as_dict() for row in report.rows}


def test_per_person_booked_used_efficiency_releases_and_no_shows(day, carol):
    rows = by_label(usage_report(start=DAY_START, end=DAY_END, by="user", viewer=carol))
    assert rows["alice"] | {"key": None} == {
        "key": None,
        "label": "alice",
        "bookings": 2,
        "booked_gpu_hours": 5.0,  # 2 GPUs x 2 h, and 1 h until the release
        "used_gpu_hours": 2.0,  # GPU 0 for an hour; GPU 3 for an hour
        "unmeasured_gpu_hours": 0.0,
        "efficiency": 0.4,
        "released_early": 1,
        "no_shows": 0,
        "no_show_gpu_hours": 0.0,
        "energy_kwh": 0.42,  # 300 W for an hour and 60 W for two
        "idle_energy_kwh": 0.12,  # the 60 W GPU's two hours under the threshold
        "energy_estimated": False,
        "cost": None,  # no tariff set
        "co2_kg": None,
        "idle_node_hours": None,  # by node only
    }
    assert (rows["bob"]["booked_gpu_hours"], rows["bob"]["used_gpu_hours"]) == (4.0, 0.0)
    assert (rows["bob"]["energy_kwh"], rows["bob"]["idle_energy_kwh"], rows["bob"]["energy_estimated"]) == (
        0.12,
        0.12,
        True,
    )
    assert rows["carol"]["energy_kwh"] is None  # no readings: no energy, not zero
    assert (rows["bob"]["no_shows"], rows["bob"]["no_show_gpu_hours"]) == (1, 4.0)
    assert (rows["carol"]["booked_gpu_hours"], rows["carol"]["no_shows"]) == (1.0, 0)  # no readings: unknown


def test_per_node_gpu_and_group(day, carol, gpus):
    report = usage_report(start=DAY_START, end=DAY_END, by="node", viewer=carol)
    assert [(r.label, r.bookings, r.booked_gpu_hours, r.used_gpu_hours) for r in report.rows] == [
        ("gpu-a100", 4, 10.0, 2.0)
    ]
    per_gpu = by_label(usage_report(start=DAY_START, end=DAY_END, by="gpu", viewer=carol))
    assert {label: (row["booked_gpu_hours"], row["used_gpu_hours"]) for label, row in per_gpu.items()} == {
        "gpu-a100/GPU 0": (2.0, 1.0),
        "gpu-a100/GPU 1": (2.0, 0.0),
        "gpu-a100/GPU 2": (4.0, 0.0),  # the 19:00 use was nobody's booking: not counted as used
        "gpu-a100/GPU 3": (2.0, 1.0),
    }
    groups = by_label(usage_report(start=DAY_START, end=DAY_END, by="group", viewer=carol))
    assert groups["vision"]["booked_gpu_hours"] == 9.0  # alice and bob
    assert groups["nlp"]["booked_gpu_hours"] == 4.0  # bob
    assert groups["(no group)"]["booked_gpu_hours"] == 1.0  # carol


def test_a_researcher_sees_only_their_own(day, alice):
    report = usage_report(start=DAY_START, end=DAY_END, by="node", viewer=alice)
    assert [(r.bookings, r.booked_gpu_hours, r.used_gpu_hours) for r in report.rows] == [(2, 5.0, 2.0)]
    assert [r.label for r in usage_report(start=DAY_START, end=DAY_END, by="user", viewer=alice).rows] == ["alice"]


def test_a_period_counts_only_the_time_inside_it(day, carol):
    rows = by_label(usage_report(start=at(1.5), end=at(5), by="user", viewer=carol))  # 10:30-14:00
    assert rows["alice"]["booked_gpu_hours"] == 3.0  # 2 GPUs x 1.5 h
    assert rows["bob"]["booked_gpu_hours"] == 1.0


def test_the_rollup_is_idempotent_and_catches_up(day, clock, gpus):
    before = sorted(UsageHour.objects.values_list("gpu_id", "hour", "used_minutes", "reservation_id"))
    rollup(since=DAY_START, until=at(11))
    rollup_recent()
    assert sorted(UsageHour.objects.values_list("gpu_id", "hour", "used_minutes", "reservation_id")) == before
    # Later minutes, the rollup idle meanwhile: the next run picks them up.
    minutes(gpus[0], at(12), 30, utilization=100)
    clock.move_to(at(16))
    rollup_recent()
    assert UsageHour.objects.get(gpu=gpus[0], hour=at(12)).used_minutes == 30


def test_demand_by_hour_of_week_in_the_readers_zone(day, carol):
    utc = demand_by_hour_of_week(start=DAY_START, end=DAY_END, viewer=carol, zone="UTC")
    monday = utc[0]
    assert monday[10] == 3.0  # alice's two GPUs and carol's
    assert monday[11] == 2.0
    assert monday[13] == 1.0  # bob
    assert monday[14] == 2.0  # bob and alice (released at 15:00)
    assert monday[15] == 1.0
    assert sum(sum(day) for day in utc) == 10.0
    berlin = demand_by_hour_of_week(start=DAY_START, end=DAY_END, viewer=carol, zone="Europe/Berlin")
    assert berlin[0][11] == 3.0  # 10:00 UTC is 11:00 in Berlin in January


def test_booked_time_counts_only_until_now(day, clock, carol, alice, gpus):
    # Tomorrow's booking is in the period but has not happened: it is demand, not usage.
    reservation_create(user=alice, gpus=[gpus[0]], start=at(20), end=at(22))
    rows = by_label(usage_report(start=DAY_START, end=DAY_END + timedelta(days=1), by="user", viewer=carol))
    assert rows["alice"]["booked_gpu_hours"] == 5.0
    assert rows["alice"]["bookings"] == 2
    clock.move_to(at(21))  # half-way through it
    rows = by_label(usage_report(start=DAY_START, end=DAY_END + timedelta(days=1), by="user", viewer=carol))
    assert (rows["alice"]["booked_gpu_hours"], rows["alice"]["bookings"]) == (6.0, 3)


def test_a_mig_slice_counts_as_its_share_of_a_card_in_reports_and_demand(alice, carol, gpus):
    slices = carve_mig(gpus[0])
    book(alice, [slices[0]], at(1), at(3))  # 3/7 of a card for 2 hours
    book(alice, [gpus[1]], at(1), at(2))  # a whole card for 1 hour
    report = usage_report(start=at(0), end=at(24), by="gpu", viewer=carol, now=at(4))
    booked = {row.label: round(row.booked_gpu_hours, 3) for row in report.rows}
    assert booked == {"gpu-a100/GPU 0 3g.40gb@0": round(2 * 3 / 7, 3), "gpu-a100/GPU 1": 1.0}
    by_user = usage_report(start=at(0), end=at(24), by="user", viewer=carol, now=at(4)).rows
    assert [(row.label, row.bookings, round(row.booked_gpu_hours, 3)) for row in by_user] == [
        ("alice", 2, round(1 + 2 * 3 / 7, 3))
    ]
    demand = demand_by_hour_of_week(start=at(0), end=at(24), viewer=carol, zone="UTC")
    monday = demand[0]
    assert (monday[10], monday[11]) == (round(1 + 3 / 7, 2), round(3 / 7, 2))  # MONDAY_9 + 1 h = 10:00


def test_slice_time_without_utilisation_is_unmeasured_not_idle(alice, bob, carol, clock, gpus):
    """On an A100 (no GPM) slices report memory and processes but no utilisation: their time is unmeasured,
    left out of efficiency and never a no-show; a slice whose card measures it is judged as a card is."""
    slices = carve_mig(gpus[0])
    unmeasured = book(alice, [slices[0]], at(1), at(3))  # 3g of 7 slices, 2 hours, no utilisation reported
    book(alice, [gpus[1]], at(1), at(2))  # a whole card, used for its hour
    idle = book(bob, [slices[1]], at(1), at(2))  # 2g, measured and idle
    minutes(slices[0], at(1), 120, utilization=None)
    minutes(gpus[1], at(1), 60, utilization=90)
    minutes(slices[1], at(1), 60, utilization=0)
    clock.move_to(at(4))
    rollup(since=at(0), until=at(4))

    rows = by_label(usage_report(start=at(0), end=at(24), by="user", viewer=carol, now=at(4)))
    alice_row, bob_row = rows["alice"], rows["bob"]
    assert alice_row["unmeasured_gpu_hours"] == round(2 * 3 / 7, 2)
    assert alice_row["used_gpu_hours"] == 1.0
    assert alice_row["efficiency"] == 1.0  # the one hour that could be judged was used
    assert alice_row["no_shows"] == 0  # nobody knows whether the slice was used
    assert (bob_row["no_shows"], bob_row["no_show_gpu_hours"]) == (1, round(2 / 7, 2))
    assert bob_row["unmeasured_gpu_hours"] == 0.0
    assert usage_report(start=at(0), end=at(24), by="user", viewer=carol, now=at(4)).has_unmeasured
    assert [hour.minutes_measured for hour in UsageHour.objects.filter(reservation=unmeasured)] == [0, 0]
    assert UsageHour.objects.get(reservation=idle).minutes_measured == 60


def test_tariffs_price_each_hour_of_energy_at_that_hour_s_rate(day, carol):
    """The day's energy falls 10:00-17:00 UTC: alice's at 10:00 and 11:00 (0.3 kWh at 10:00 on GPU 0 and 0.06 kWh
    in each hour on GPU 1), bob's 13:00-17:00 (0.03 kWh an hour). An all-day tariff, and a cheaper, cleaner one
    from 13:00 (say, the afternoon's solar); a night tariff that never applies; and one hour without a price."""
    Tariff.objects.create(name="day", price_per_kwh=Decimal("0.30"), co2_g_per_kwh=Decimal("400"))
    Tariff.objects.create(
        name="solar", price_per_kwh=Decimal("0.10"), co2_g_per_kwh=Decimal("50"), hour_from=13, hour_until=16
    )
    Tariff.objects.create(name="night", price_per_kwh=Decimal("0.05"), hour_from=0, hour_until=6)
    Tariff.objects.create(name="grid only", co2_g_per_kwh=Decimal("300"), hour_from=16, hour_until=17)

    rows = by_label(usage_report(start=DAY_START, end=DAY_END, by="user", viewer=carol))

    # alice: 0.42 kWh at the day rate.
    assert (rows["alice"]["cost"], rows["alice"]["co2_kg"]) == (0.13, 0.168)
    # bob: 13, 14, 15 at the solar rate, 16 with a CO₂ figure and no price.
    assert (rows["bob"]["cost"], rows["bob"]["co2_kg"]) == (0.01, 0.0135)
    assert rows["carol"]["cost"] is None  # no energy: nothing to price


def test_tariff_hours_must_not_overlap_and_one_all_day_at_most(db):
    Tariff.objects.create(name="day", price_per_kwh=Decimal("0.30"))
    Tariff.objects.create(name="evening", price_per_kwh=Decimal("0.40"), hour_from=17, hour_until=21)
    for bad, says in [
        (Tariff(name="another day", price_per_kwh=Decimal("0.2")), "all-day tariff already"),
        (Tariff(name="late", price_per_kwh=Decimal("0.2"), hour_from=20, hour_until=23), "overlap evening"),
        (Tariff(name="night", price_per_kwh=Decimal("0.2"), hour_from=22, hour_until=6), "two, 22-24 and 0-6"),
        (Tariff(name="half", price_per_kwh=Decimal("0.2"), hour_from=3), "both hours"),
        (Tariff(name="empty", hour_from=1, hour_until=2), "price per kWh, grams of CO₂e"),
    ]:
        with pytest.raises(ValidationError, match=says):
            bad.full_clean()
    Tariff(name="night", price_per_kwh=Decimal("0.2"), hour_from=21, hour_until=24).full_clean()  # adjoining: fine


def test_a_mig_slice_s_booking_takes_its_share_of_its_card_s_energy_marked_estimated(alice, carol, gpus):
    """NVML counts energy per card: a 3g slice of a 7-slice card is given 3/7 of each of the card's minutes."""
    slices = carve_mig(gpus[0])
    booking = book(alice, [slices[0]], at(1), at(2))
    minutes(gpus[0], at(1), 60, utilization=None, energy_mj=7_000_000)  # the card: 7 kJ a minute
    minutes(slices[0], at(1), 60, utilization=None)  # the slice's own readings: memory and processes

    rollup(since=at(1), until=at(2))

    hour = UsageHour.objects.get(reservation=booking)
    assert (hour.energy_mj, hour.energy_estimated) == (60 * 3_000_000, True)
    row = by_label(usage_report(start=at(0), end=at(3), by="user", viewer=carol, now=at(3)))["alice"]
    assert (row["energy_kwh"], row["energy_estimated"]) == (0.05, True)


def test_fully_idle_node_hours_per_node_and_for_the_fleet_for_admins_only(day, carol, alice, bob):
    """Up to 20:00 gpu-a100 was held 10:00-12:00 and 13:00-17:00 (overlapping bookings count once; alice's
    14:00 booking released at 15:00 within bob's); a spare node was under whole-node maintenance 00:00-06:00
    (not idle) and had a pending request 07:00-08:00 (nothing opened: idle) and one GPU under maintenance
    09:00-10:00 (the node's other GPU was free: idle)."""
    spare = node_with_gpus(2, name="z-spare")
    node_with_gpus(1, name="retired", status=Node.Status.DISABLED)  # out of service: not idle, not counted
    MaintenanceWindow.objects.create(node=spare, start=at(-9), end=at(-3))
    MaintenanceWindow.objects.create(node=spare, gpu=spare.gpus.get(index=0), start=at(0), end=at(1))
    book(bob, list(spare.gpus.all()), at(-2), at(-1), pending=True, direct=True)

    report = usage_report(start=DAY_START, end=DAY_END, by="node", viewer=carol)

    rows = by_label(report)
    assert (rows["gpu-a100"]["idle_node_hours"], rows["z-spare"]["idle_node_hours"]) == (14.0, 14.0)
    assert rows["z-spare"]["bookings"] == 0  # listed, though nobody booked it
    assert (report.idle_node_hours, report.node_hours, report.total.idle_node_hours) == (28.0, 40.0, 28.0)
    by_user = usage_report(start=DAY_START, end=DAY_END, by="user", viewer=carol)
    assert (by_user.idle_node_hours, by_user.node_hours) == (28.0, 40.0)
    assert {row.idle_node_hours for row in by_user.rows} == {None}

    own = usage_report(start=DAY_START, end=DAY_END, by="node", viewer=alice)
    assert (own.idle_node_hours, own.node_hours) == (None, None)  # a fleet figure: not a researcher's
    assert [row.label for row in own.rows] == ["gpu-a100"]
