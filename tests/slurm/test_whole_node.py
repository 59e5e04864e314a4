"""Slurm 22.05 reserves whole nodes only, so the portal books a Slurm-managed node whole rather than pretend
(docs/slurm.md): a booking of some of its GPUs is refused with the ids to book, all of them count in the limits,
and the calendar says so."""

from __future__ import annotations

import pytest

from nodes.models import Node
from reservations.calendar_data import calendar_resources
from reservations.exceptions import InvalidBooking
from reservations.services import reservation_create
from tests.conftest import at
from tests.factories import node_with_gpus

pytestmark = pytest.mark.usefixtures("clock")


@pytest.fixture
def slurm_node(db) -> Node:
    node = node_with_gpus(4, name="slurm-a100")
    node.manager, node.books_whole = Node.Manager.SLURM, True
    node.save()
    return node


def test_some_gpus_of_a_slurm_node_are_refused_with_the_ids_to_book(alice, slurm_node):
    gpus = list(slurm_node.gpus.order_by("index"))
    with pytest.raises(InvalidBooking) as refused:
        reservation_create(user=alice, gpus=gpus[:1], start=at(1), end=at(2))
    ids = ", ".join(str(gpu.pk) for gpu in gpus)
    assert str(refused.value) == (
        f"Node slurm-a100 is managed by Slurm, which reserves whole nodes: book all its 4 GPUs (ids {ids}), "
        "which count as 4 in your limits."
    )

    booking = reservation_create(user=alice, gpus=gpus, start=at(1), end=at(2))
    assert booking.gpus.count() == 4


def test_an_agent_node_is_booked_by_the_gpu_as_ever(alice, gpus):
    assert reservation_create(user=alice, gpus=gpus[:1], start=at(1), end=at(2)).gpus.count() == 1


def test_the_calendar_says_a_slurm_node_is_booked_whole(slurm_node, node):
    rows = {row["extendedProps"]["node"]: row for row in calendar_resources()}
    assert rows["slurm-a100"]["title"] == "slurm-a100 (Slurm: booked whole)"
    assert rows["slurm-a100"]["extendedProps"]["whole_node"] is True
    assert rows[node.name]["extendedProps"]["whole_node"] is False
