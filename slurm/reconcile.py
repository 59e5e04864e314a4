"""Keeping a Slurm cluster's advance reservations in step with the portal's bookings (issue 23).

Level-triggered, like the agents' leases: each pass reads what the controller has (``scontrol show
reservation``), works out what it should have (every approved booking on a Slurm-managed node that has not ended,
and starts within SLURM_RESERVATION_LEAD_HOURS if that is set), and creates, updates or deletes the difference.
Only reservations named ``gpubook-<id>`` are the portal's; an operator's own are never touched. A controller that
cannot be reached changes nothing (the bookings stand; the next pass catches up); a reservation Slurm refuses
(overlapping an operator's maintenance, say) is recorded with Slurm's words for the admins and the holder.

Slurm 22.05 (Debian 12) cannot reserve single GPUs ("TRES type 'gres/gpu' not supported with reservations"):
a booking's reservation holds its whole node, and the booking service books such a node whole (Node.books_whole).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction

from nodes.models import Node
from reservations.models import Allocation, Reservation
from slurm.models import SlurmReservation
from slurm.scontrol import RESERVATION_PREFIX, Scontrol, SlurmError
from slurm.scontrol import SlurmReservation as Wanted

FLAGS = ("MAGNETIC",)  # the holder's plain sbatch and srun land in it without naming it


@dataclass
class Pass:
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)


def reservation_name(reservation_id: int) -> str:
    return f"{RESERVATION_PREFIX}{reservation_id}"


def wanted_reservations(*, now: datetime) -> dict[str, tuple[int, Wanted]]:
    """Name -> (booking id, the reservation Slurm should hold), for every booking on a Slurm node it should hold."""
    bookings = Reservation.objects.filter(
        status=Reservation.Status.APPROVED, node__manager=Node.Manager.SLURM, end__gt=now, user__is_active=True
    ).select_related("node", "user")
    lead = settings.SLURM_RESERVATION_LEAD_HOURS
    if lead:
        bookings = bookings.filter(start__lt=now + timedelta(hours=lead))
    live = Allocation.objects.filter(active=True, reservation__in=bookings).values_list("reservation_id", flat=True)
    wanted = {}
    for booking in bookings.filter(pk__in=live):
        if not booking.user.unix_username:
            continue  # nobody Slurm would know: it waits for the username, as an agent's lease does
        name = reservation_name(booking.pk)
        wanted[name] = (
            booking.pk,
            Wanted(
                name=name,
                users=(booking.user.unix_username,),
                start=max(booking.start, now),  # Slurm refuses a start in the past
                end=booking.end,
                nodes=booking.node.name,
                flags=FLAGS,
                tres="",
            ),
        )
    return wanted


def reconcile(*, scontrol: Scontrol, now: datetime) -> Pass:
    """One pass. SlurmError (the controller unreachable) propagates before anything changed."""
    actual = {item.name: item for item in scontrol.reservations() if item.is_ours}
    wanted = wanted_reservations(now=now)
    done = Pass()
    for name, (booking_id, item) in wanted.items():
        have = actual.get(name)
        try:
            if have is not None and have.start <= now < item.start:
                # It has started, and should not have yet (Slurm cannot move a started reservation's start):
                # made anew, so that nobody holds the node before their slot.
                scontrol.delete(name)
                have = None
            if have is None:
                scontrol.create(item)
                done.created.append(name)
            elif _differs(have, item):
                scontrol.update(item)
                done.updated.append(name)
        except SlurmError as refusal:
            done.refused[name] = str(refusal)
            _record(booking_id, name, SlurmReservation.State.REFUSED, str(refusal), now)
            continue
        _record(booking_id, name, SlurmReservation.State.SYNCED, "", now)
    for name in sorted(set(actual) - set(wanted)):
        try:
            scontrol.delete(name)
        except SlurmError as refusal:
            done.refused[name] = str(refusal)
            continue
        done.deleted.append(name)
        SlurmReservation.objects.filter(name=name).update(
            state=SlurmReservation.State.REMOVED, problem="", synced_at=now
        )
    return done


def _differs(have: Wanted, want: Wanted) -> bool:
    # A running reservation's start is in the past and stays: only its end and users matter then.
    started = have.start <= want.start
    return have.end != want.end or set(have.users) != set(want.users) or (not started and have.start != want.start)


@transaction.atomic
def _record(booking_id: int, name: str, state: str, problem: str, now: datetime) -> None:
    SlurmReservation.objects.update_or_create(
        reservation_id=booking_id, defaults={"name": name, "state": state, "problem": problem, "synced_at": now}
    )
