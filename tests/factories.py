"""What tests make: factory_boy factories, a node with its GPUs, and ``book()``, the one way a test
sets up a booking."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import factory
from django.contrib.auth import get_user_model

from nodes.models import Gpu, Node
from reservations.models import Allocation, Reservation
from reservations.services import reservation_create


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        django_get_or_create = ("username",)

    username = factory.Sequence(lambda n: f"user{n}")
    unix_username = factory.LazyAttribute(lambda o: o.username)
    email = factory.LazyAttribute(lambda o: f"{o.username}@lab.example")
    password = factory.django.Password("correct horse battery staple")


class NodeFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Node

    name = factory.Sequence(lambda n: f"node-{n}")
    hostname = factory.LazyAttribute(lambda o: f"{o.name}.lab.example")


class GpuFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Gpu

    node = factory.SubFactory(NodeFactory)
    index = factory.Sequence(lambda n: n)
    uuid = factory.Sequence(lambda n: f"GPU-{n:08x}-0000-0000-0000-000000000000")
    model = "NVIDIA A100-SXM4-80GB"
    memory_mib = 81920


def node_with_gpus(count: int = 4, **node_fields: object) -> Node:
    node = NodeFactory(**node_fields)
    for index in range(count):
        GpuFactory(node=node, index=index)
    return node


def book(
    user: Any,
    gpus: Sequence[Gpu],  # or what a test passes to see it refused: ids, junk, none
    start: datetime,
    end: datetime,
    *,
    purpose: str = "",
    actor: Any | None = None,
    pending: bool = False,
    direct: bool = False,
) -> Reservation:
    """``user``'s booking of ``gpus`` (all on one node) from ``start`` to ``end``.

    Made by reservation_create, as people make them: the rules apply, and the audit entry and the
    confirmation mail are written. ``actor`` books for someone else (an admin's booking skips the
    limits and approval); ``pending`` makes it a request that waits for approval even on a node
    that needs none.

    ``direct`` writes the reservation and its allocations as the service leaves them, approved
    unless ``pending``, without its rules: for a slot that began in the past, which the service
    refuses, and for tests on the real clock, whose current grid cell may have just moved on.
    """
    if direct:
        status = Reservation.Status.PENDING if pending else Reservation.Status.APPROVED
        reservation = Reservation.objects.create(
            user=user,
            node=gpus[0].node,
            start=start,
            end=end,
            status=status,
            purpose=purpose,
            created_by=actor or user,
        )
        for gpu in gpus:
            Allocation.objects.create(reservation=reservation, gpu=gpu, start=start, end=end)
        return reservation
    required = 0
    if pending:  # the service asks for approval where the node requires it: require it for this booking
        required = Node.objects.filter(pk=gpus[0].node_id, requires_approval=False).update(requires_approval=True)
    try:
        return reservation_create(user=user, gpus=gpus, start=start, end=end, purpose=purpose, actor=actor)
    finally:
        if required:
            Node.objects.filter(pk=gpus[0].node_id).update(requires_approval=False)


# A100-style: 7 compute slices, 8 memory slices; 3g.40gb takes memory slices 0-3, the 2g.20gb 4-5 and 6-7.
MIG_LAYOUT = (("3g.40gb", 3, 0, 4), ("2g.20gb", 2, 4, 2), ("2g.20gb", 2, 6, 2))


def carve_mig(card: Gpu, *, confirmed: bool = True) -> list[Gpu]:
    """Put ``card`` in MIG mode with MIG_LAYOUT's slices, as its agent's report and an admin's confirmation would."""
    Gpu.objects.filter(pk=card.pk).update(mig_mode=True, compute_slices=7)
    card.refresh_from_db()
    return [
        GpuFactory(
            node=card.node,
            index=card.index,
            parent=card,
            uuid=f"MIG-{card.index:02x}{n:06x}-0000-0000-0000-000000000000",
            memory_mib=20480 * size // 2,
            profile=profile,
            compute_slices=compute,
            placement_start=start,
            placement_size=size,
            bookable=confirmed,
        )
        for n, (profile, compute, start, size) in enumerate(MIG_LAYOUT)
    ]
