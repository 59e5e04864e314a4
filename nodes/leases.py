"""A node's desired state: every current and upcoming lease, versioned and signed.

The portal always sends a node its *whole* desired state, never a delta (docs/architecture.md,
"leases are level-triggered"): a lost message is repaired by the next one. Only approved
reservations become leases; a pending booking holds its slot but opens no GPU.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import F

from nodes.agent.signing import signed
from nodes.models import Node
from reservations.models import Allocation, Reservation

LEASE_HORIZON = timedelta(hours=24)


def node_leases(*, node: Node, now: datetime) -> list[dict[str, Any]]:
    """Approved reservations on ``node`` that are running or start within the horizon."""
    rows = (
        Allocation.objects.filter(
            active=True,
            gpu__node=node,
            reservation__status=Reservation.Status.APPROVED,
            end__gt=now,
            start__lt=now + LEASE_HORIZON,
        )
        .select_related("reservation__user", "gpu")
        .order_by("start", "reservation_id", "gpu__index")
    )
    leases: dict[int, dict[str, Any]] = {}
    for allocation in rows:
        lease = leases.setdefault(
            allocation.reservation_id,
            {
                "reservation": allocation.reservation_id,
                "user": allocation.reservation.user.unix_username,
                "gpus": [],
                "start": allocation.start.isoformat(),
                "end": allocation.end.isoformat(),
            },
        )
        lease["gpus"].append(allocation.gpu.uuid)
    return list(leases.values())


def node_snapshot(*, node: Node, now: datetime) -> dict[str, Any]:
    """The signed snapshot for ``node``, with a version higher than any sent before."""
    with transaction.atomic():
        Node.objects.filter(pk=node.pk).update(lease_version=F("lease_version") + 1)
        current = Node.objects.only("name", "lease_secret", "lease_version").get(pk=node.pk)
        snapshot = {
            "node": current.name,
            "version": current.lease_version,
            "issued_at": now.isoformat(),
            "horizon_end": (now + LEASE_HORIZON).isoformat(),
            "leases": node_leases(node=current, now=now),
        }
    return signed(snapshot, current.lease_secret)
