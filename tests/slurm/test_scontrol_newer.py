"""Reading scontrol's one-line records (slurm/scontrol.py) as a newer Slurm (25.05) writes them, with reservations
that hold some of a node's GPUs (TRES=gres/gpu...).

The output in tests/slurm/fixtures/scontrol/ was WRITTEN FROM SLURM'S DOCUMENTATION AND SOURCE, NOT RECORDED from a
live Slurm: Debian 12 ships Slurm 22.05, which cannot reserve GPUs. Its README.md says where each detail comes from.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from slurm.scontrol import node_from, parse_records, reservation_from

FIXTURES = Path(__file__).parent / "fixtures" / "scontrol"


def records(name: str, key: str) -> dict[str, dict[str, str]]:
    return {record[key]: record for record in parse_records((FIXTURES / name).read_text())}


@pytest.fixture
def reservations() -> dict[str, dict[str, str]]:
    return records("show_reservation_25.05.txt", "ReservationName")


@pytest.fixture
def nodes() -> dict[str, dict[str, str]]:
    return records("show_node_25.05.txt", "NodeName")


def test_a_gpu_reservation_is_read_with_its_tres_users_flags_and_times(reservations):
    reservation = reservation_from(reservations["gpubook-7"])
    assert reservation.users == ("alice",) and reservation.flags == ("SPEC_NODES", "MAGNETIC")
    assert reservation.nodes == "gpu01" and reservation.is_ours
    assert reservation.tres == "gres/gpu=2,cpu=2"
    assert reservation.start == datetime(2031, 1, 7, 9, tzinfo=UTC)
    assert reservation.end == datetime(2031, 1, 7, 13, tzinfo=UTC)


def test_the_cores_a_gpu_reservation_holds_do_not_spill_into_its_flags_or_tres(reservations):
    # "Flags=SPEC_NODES,MAGNETIC   NodeName=gpu01 CoreIDs=0-1 TRES=...": the core group reads as keys of its own.
    record = reservations["gpubook-7"]
    assert record["Flags"] == "SPEC_NODES,MAGNETIC"
    assert (record["NodeName"], record["CoreIDs"]) == ("gpu01", "0-1")
    assert record["TRES"] == "gres/gpu=2,cpu=2"


def test_a_typed_gpu_reservation_keeps_every_tres_in_one_value(reservations):
    reservation = reservation_from(reservations["gpubook-8"])
    assert reservation.tres == "gres/gpu=2,gres/gpu:a100=2,cpu=2"
    assert reservation.users == ("bob",) and reservation.end == datetime(2031, 1, 8, 9, tzinfo=UTC)


def test_an_operators_reservation_with_a_comment_is_read_and_is_not_ours(reservations):
    reservation = reservation_from(reservations["maint-2031"])
    assert reservation.flags == ("MAINT", "SPEC_NODES") and not reservation.is_ours
    assert reservations["maint-2031"]["Comment"] == "PSU swap, ask ops@lab"
    assert reservations["maint-2031"]["MaxStartDelay"] == "(null)"


def test_a_node_in_a_gpu_reservation_is_read_with_its_gres_and_state(nodes):
    node = node_from(nodes["gpu01"])
    assert (node.name, node.hostname, node.gpu_type, node.gpu_count) == ("gpu01", "gpu01", "a100", 4)
    assert node.state == "MIXED+RESERVED" and not node.offline
    # A node record names a reservation at its end: one, though gpubook-7 and gpubook-8 both hold some of gpu01.
    assert nodes["gpu01"]["ReservationName"] == "gpubook-8"
    assert nodes["gpu01"]["OS"] == "Linux 6.1.0-28-amd64 #1 SMP PREEMPT_DYNAMIC Debian 6.1.119-1 (2024-11-22)"


def test_gres_listed_once_per_socket_is_counted_whole(nodes):
    node = node_from(nodes["gpu02"])
    assert (node.gpu_type, node.gpu_count) == ("h100", 4)
    assert node.state == "IDLE+DRAIN" and node.offline
    assert node.reason == "fan failure [root@2031-01-06T18:05:00]"


def test_an_empty_value_is_read_as_empty(nodes):
    assert nodes["gpu02"]["AllocTRES"] == ""


def test_a_node_in_a_maintenance_reservation_counts_as_offline(nodes):
    node = node_from(nodes["gpu03"])
    assert node.state == "IDLE+MAINTENANCE+RESERVED"
    assert node.offline
