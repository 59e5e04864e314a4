"""Slurm 23.11 on reserves single GPUs (``TRES=gres/gpu=<n>``; typed from 25.05; docs/slurm.md): once the
portal reads such a release, its nodes are booked by the GPU and each reservation holds the booking's GPUs rather
than the node. Debian 12 ships Slurm 22.05, so no such controller runs here: ``NewerSlurm`` below stands in for
one, an in-memory controller keeping what the portal asked of it (the real one's answers for 22.05 are in
tests/slurm/test_reservations.py; the wire format of newer releases in test_rest.py and test_scontrol_newer.py).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from nodes.models import Node
from reservations.exceptions import InvalidBooking
from reservations.services import reservation_create
from slurm.controller import Capabilities
from slurm.models import SlurmCluster
from slurm.naming import reservation_name
from slurm.reconcile import reconcile
from slurm.scontrol import SlurmNode, SlurmReservation
from slurm.services import slurm_nodes_import, slurm_reconcile
from tests.conftest import at

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("clock")]


class NewerSlurm:
    """A controller of the given release with one node "vm" of four a100 GPUs."""

    def __init__(self, version: tuple[int, int, int]) -> None:
        self.version = version
        self.held: dict[str, SlurmReservation] = {}

    def capabilities(self) -> Capabilities:
        return Capabilities(version=self.version, api="rest")

    def nodes(self) -> list[SlurmNode]:
        return [SlurmNode(name="vm", hostname="vm", state="IDLE", gpu_type="a100", gpu_count=4, reason="")]

    def reservations(self) -> list[SlurmReservation]:
        return list(self.held.values())

    def create(self, reservation: SlurmReservation) -> None:
        self.held[reservation.name] = reservation

    def update(self, reservation: SlurmReservation) -> None:
        self.held[reservation.name] = replace(reservation, tres=self.held[reservation.name].tres)

    def delete(self, name: str) -> None:
        del self.held[name]


def imported(controller: NewerSlurm) -> Node:
    slurm_nodes_import(controller=controller)
    return Node.objects.get(name="vm")


def test_a_release_that_reserves_gpus_has_its_nodes_booked_by_the_gpu(alice, bob):
    slurm = NewerSlurm((23, 11, 4))
    node = imported(slurm)
    assert not node.books_whole
    gpus = list(node.gpus.order_by("index"))

    two = reservation_create(user=alice, gpus=gpus[:2], start=at(1), end=at(3))
    one = reservation_create(user=bob, gpus=gpus[2:3], start=at(1), end=at(2))  # the same node, the same time
    done = reconcile(controller=slurm, capabilities=slurm.capabilities(), now=at(0))

    assert sorted(done.created) == sorted([reservation_name(two.pk), reservation_name(one.pk)])
    held = slurm.held[reservation_name(two.pk)]
    assert (held.nodes, held.tres, held.users, held.flags) == ("vm", "gres/gpu=2", ("alice",), ("MAGNETIC",))
    assert slurm.held[reservation_name(one.pk)].tres == "gres/gpu=1"


def test_from_25_05_the_gpus_are_reserved_by_their_type(alice):
    slurm = NewerSlurm((25, 5, 1))
    node = imported(slurm)
    booking = reservation_create(user=alice, gpus=list(node.gpus.order_by("index"))[:2], start=at(1), end=at(2))
    reconcile(controller=slurm, capabilities=slurm.capabilities(), now=at(0))
    assert slurm.held[reservation_name(booking.pk)].tres == "gres/gpu:a100=2"


def test_an_untyped_gres_is_reserved_by_count_alone(alice):
    slurm = NewerSlurm((25, 11, 0))
    node = imported(slurm)
    node.gpus.update(model="Slurm GPU")  # as the import names the GPUs of a GRES without a type
    booking = reservation_create(user=alice, gpus=list(node.gpus.all())[:3], start=at(1), end=at(2))
    reconcile(controller=slurm, capabilities=slurm.capabilities(), now=at(0))
    assert slurm.held[reservation_name(booking.pk)].tres == "gres/gpu=3"


def test_22_05_reserves_the_whole_node_and_sends_no_gpu_tres(alice):
    slurm = NewerSlurm((22, 5, 8))
    node = imported(slurm)
    assert node.books_whole
    with pytest.raises(InvalidBooking, match="reserves whole nodes"):
        reservation_create(user=alice, gpus=list(node.gpus.all())[:1], start=at(1), end=at(2))
    booking = reservation_create(user=alice, gpus=list(node.gpus.all()), start=at(1), end=at(2))
    reconcile(controller=slurm, capabilities=slurm.capabilities(), now=at(0))
    assert slurm.held[reservation_name(booking.pk)].tres == ""


def test_a_cluster_upgraded_under_the_portal_is_booked_by_the_gpu_from_the_next_pass(alice, monkeypatch):
    old = NewerSlurm((22, 5, 8))
    node = imported(old)
    new = NewerSlurm((23, 11, 4))
    monkeypatch.setattr("slurm.services.controller_from_settings", lambda: new)

    slurm_reconcile(now=at(0))

    node.refresh_from_db()
    cluster = SlurmCluster.objects.get()
    assert not node.books_whole and (cluster.version, cluster.gpu_reservations) == ("23.11.4", True)
    assert reservation_create(user=alice, gpus=list(node.gpus.all())[:1], start=at(1), end=at(2)).gpus.count() == 1


def test_the_booking_page_says_how_many_gpus_the_reservation_holds(alice, client):
    slurm = NewerSlurm((23, 11, 4))
    node = imported(slurm)
    booking = reservation_create(user=alice, gpus=list(node.gpus.order_by("index"))[:2], start=at(1), end=at(2))
    reconcile(controller=slurm, capabilities=slurm.capabilities(), now=at(0))
    client.force_login(alice)
    html = client.get(f"/reservations/{booking.pk}/").content.decode()
    assert f"<code>{reservation_name(booking.pk)}</code> for you on vm (2 GPUs)" in html
    assert "<code>--gres=gpu:2</code>" in html
