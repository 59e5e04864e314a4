"""A node's desired state: every current and upcoming lease, versioned and signed.

The portal always sends a node its *whole* desired state, never a delta (docs/architecture.md,
"leases are level-triggered"): a lost message is repaired by the next one. Only approved
reservations of active accounts with a confirmed unix username become leases: a pending booking
holds its slot but opens no GPU, and neither does a deactivated person's booking (even before
reservations_end_for_inactive_user has ended it) nor one whose unix username an admin has not
confirmed yet.

A lease may also carry environments to run while it lasts (issue 22). Their rows belong to an app above this one
(environments), which registers a reader here in its ``AppConfig.ready()``: ``read(reservation_ids=..., now=...)``
returns, per reservation, its ``protocol.LaunchRequest`` list.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import F, Value
from django.db.models.functions import Greatest

from gpubook_agent import protocol
from gpubook_agent.signing import sign
from nodes.models import Node
from reservations.models import Allocation, Reservation

LEASE_HORIZON = timedelta(hours=24)
log = logging.getLogger(__name__)

LaunchReader = Callable[..., Mapping[int, list[protocol.LaunchRequest]]]
lease_launch_readers: list[LaunchReader] = []


def node_leases(*, node: Node, now: datetime) -> list[protocol.Lease]:
    """Approved reservations on ``node`` that are running or start within the horizon."""
    rows = (
        Allocation.objects.filter(
            active=True,
            gpu__node=node,
            reservation__status=Reservation.Status.APPROVED,
            reservation__user__is_active=True,
            end__gt=now,
            start__lt=now + LEASE_HORIZON,
        )
        .select_related("reservation__user", "gpu")
        .order_by("start", "reservation_id", "gpu__index")
    )
    leases: dict[int, protocol.Lease] = {}
    for allocation in rows:
        username = allocation.reservation.user.unix_username
        if not username:
            # One lease the agent would refuse must not freeze the whole node's snapshot.
            log.warning("reservation %s has no unix username; left out of %s's leases", allocation.reservation_id, node)
            continue
        lease = leases.setdefault(
            allocation.reservation_id,
            protocol.lease(
                reservation=allocation.reservation_id,
                user=username,
                gpus=[],
                start=allocation.start,
                end=allocation.end,
            ),
        )
        lease["gpus"].append(allocation.gpu.uuid)
    for read in lease_launch_readers:
        for reservation_id, launches in read(reservation_ids=list(leases), now=now).items():
            if launches and reservation_id in leases:
                leases[reservation_id].setdefault("launches", []).extend(launches)
    return list(leases.values())


def node_snapshot(*, node: Node, now: datetime) -> protocol.Snapshot:
    """The signed snapshot for ``node``, with a version higher than any issued before.

    Built fresh for every push and every pull, so ``issued_at`` is always now (agents refuse old ones),
    and ``Node.lease_version`` is always the newest version issued: what heartbeat replies tell the
    agent, which pulls when it has seen less (a pull issues the version it then has, so it pulls once)."""
    with transaction.atomic():
        # At least the clock in milliseconds: after a database restore lowers the counter, the next
        # snapshot is still newer than anything the agent holds, instead of refused for weeks.
        floor = int(now.timestamp() * 1000)
        Node.objects.filter(pk=node.pk).update(lease_version=Greatest(F("lease_version") + 1, Value(floor)))
        current = Node.objects.only("name", "lease_secret", "lease_version", "idle_power_limit_pct").get(pk=node.pk)
        snapshot = protocol.snapshot(
            node=current.name,
            version=current.lease_version,
            issued_at=now,
            horizon_end=now + LEASE_HORIZON,
            leases=node_leases(node=current, now=now),
            # The admins' idle power cap travels signed with the leases: the agent applies it by its own clock.
            idle_power_limit_pct=current.idle_power_limit_pct,
        )
    snapshot["signature"] = sign(snapshot, current.lease_secret)
    return snapshot
