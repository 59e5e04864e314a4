"""The "Slurm" part of a booking's page on a Slurm-managed node: its reservation, where it stands, and how to use
it (reservations/detail_parts.py)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from nodes.models import Node
from reservations.models import Reservation
from slurm.models import SlurmReservation
from slurm.naming import reservation_name


def reservation_slurm(*, reservation: Reservation, viewer: Any, now: datetime) -> dict[str, Any] | None:
    if reservation.node.manager != Node.Manager.SLURM:
        return None
    record = SlurmReservation.objects.filter(reservation=reservation).first()
    return {
        "name": reservation_name(reservation.pk),
        "record": record,
        "refused": record is not None and record.state == SlurmReservation.State.REFUSED,
        "in_slurm": record is not None and record.state == SlurmReservation.State.SYNCED,
        "live": reservation.is_live and reservation.end > now,
        "gpus": reservation.allocations.filter(active=True).count(),
    }
