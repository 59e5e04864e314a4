"""Capacity a booking change frees, announced to what waits for it (the waitlist, above this app).

A cancelled or rejected booking frees what is left of its slot; an early release frees the rest of it. The
announcement (``capacity_freed``, in the change's transaction: reservations/signals.py) goes out at once, or,
inside ``announced_after()``, at the end of the block: an edit that cancels bookings and books them again (a
series edit) must not see its own slots offered to others before it books them, and what it does not book
again is announced then, still in its transaction. A block that raises announces nothing (its transaction
rolls back anyway).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime
from typing import Any

from nodes.models import Node
from reservations.models import Reservation
from reservations.signals import capacity_freed

# A change with these verbs frees its booking's whole slot (what is left of it); a release frees the rest.
_FREES_ALL = {"cancel", "reject"}
_HELD = {Reservation.Status.PENDING, Reservation.Status.APPROVED, Reservation.Status.OFFERED}
_deferred: ContextVar[list[dict[str, Any]] | None] = ContextVar("capacity_freed_deferred", default=None)


def announce_freed_by(
    reservation: Reservation, *, verb: str, before: dict[str, Any] | None, after: dict[str, Any]
) -> None:
    """Announce what this change of ``reservation`` freed, if anything (a receiver of reservation_changed)."""
    if before is None or before["status"] not in _HELD:
        return
    if verb in _FREES_ALL:
        start, end = before["start"], before["end"]
    elif verb == "release":
        start, end = after["end"], before["end"]
    else:
        return
    announce_freed(
        node=reservation.node,
        gpu_ids=list(reservation.allocations.values_list("gpu_id", flat=True)),
        start=datetime.fromisoformat(start),
        end=datetime.fromisoformat(end),
    )


def announce_freed(*, node: Node, gpu_ids: list[int], start: datetime, end: datetime) -> None:
    freed = {"node": node, "gpu_ids": gpu_ids, "start": start, "end": end}
    waiting = _deferred.get()
    if waiting is not None:
        waiting.append(freed)
    else:
        capacity_freed.send(sender=Reservation, **freed)


@contextmanager
def announced_after() -> Iterator[None]:
    """Hold back what the block frees until it has done its own booking; then announce it."""
    waiting: list[dict[str, Any]] = []
    token = _deferred.set(waiting)
    try:
        yield
    finally:
        _deferred.reset(token)
    for freed in waiting:  # not reached when the block raised; inside an outer block, held for its end
        announce_freed(**freed)
