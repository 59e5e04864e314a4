"""How the Slurm link reacts to booking changes: a reconcile pass once the change has committed."""

from __future__ import annotations

import logging
from typing import Any

from django.dispatch import receiver

from nodes.models import Node
from reservations.models import Reservation
from reservations.signals import reservation_changed
from slurm.tasks import reconcile

log = logging.getLogger(__name__)


@receiver(reservation_changed.on_commit)
def reconcile_soon(sender: type, reservation: Reservation, **kwargs: Any) -> None:
    """A booking on a Slurm node changed: its reservation follows within moments rather than at beat's minute."""
    if reservation.node.manager != Node.Manager.SLURM:
        return

    try:
        reconcile.apply_async(expires=60)
    except Exception:  # the broker down: beat's pass catches up
        log.warning("could not queue the Slurm reconcile; beat's next pass does it", exc_info=True)
