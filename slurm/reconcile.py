"""Keeping a Slurm cluster's advance reservations in step with the portal's bookings (issue 23).

Level-triggered, like the agents' leases: each pass reads what the controller has (``scontrol show
reservation``), works out what it should have (every approved booking on a Slurm-managed node that has not ended,
and starts within SLURM_RESERVATION_LEAD_HOURS if that is set), and creates, updates or deletes the difference.
Only reservations named ``gpubook-<id>`` are the portal's; an operator's own are never touched. A controller that
cannot be reached changes nothing (the bookings stand; the next pass catches up); a reservation Slurm refuses
(overlapping an operator's maintenance, say) is recorded with Slurm's words for the admins and the holder.

Slurm before 23.11 (Debian 12 ships 22.05) cannot reserve single GPUs ("TRES type 'gres/gpu' not supported with
reservations"): a booking's reservation holds its whole node, and the booking service books such a node whole
(Node.books_whole, set from the cluster's Capabilities). Newer releases reserve the booking's GPUs on its node:
``TRES=gres/gpu=<n>``, or ``gres/gpu:<type>=<n>`` from 25.05 (before, a type alone did not reserve right). Several
such reservations share a node at once; Slurm refuses one ("Requested nodes are busy") while a job on the node runs
past its start, which is recorded and retried each pass like any refusal.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Count, Q

from nodes.models import Node
from reservations.models import Allocation, Reservation
from slurm import signals
from slurm.controller import Capabilities, Controller
from slurm.models import SlurmReservation
from slurm.naming import gres_type_of, reservation_name
from slurm.scontrol import SlurmError, SlurmInUse, SlurmUnreachable
from slurm.scontrol import SlurmReservation as Wanted

FLAGS = ("MAGNETIC",)  # the holder's plain sbatch and srun land in it without naming it


@dataclass
class Pass:
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    ended: list[str] = field(default_factory=list)  # in use by running jobs: ended now, deleted by a later pass
    refused: dict[str, str] = field(default_factory=dict)


def wanted_reservations(*, capabilities: Capabilities, now: datetime) -> dict[str, tuple[int, Wanted]]:
    """Name -> (booking id, the reservation Slurm should hold), for every booking on a Slurm node it should hold."""
    bookings = (
        Reservation.objects.filter(
            status=Reservation.Status.APPROVED, node__manager=Node.Manager.SLURM, end__gt=now, user__is_active=True
        )
        .select_related("node", "user")
        .annotate(gpu_count=Count("allocations", filter=Q(allocations__active=True)))
    )
    lead = settings.SLURM_RESERVATION_LEAD_HOURS
    if lead:
        bookings = bookings.filter(start__lt=now + timedelta(hours=lead))
    live = Allocation.objects.filter(active=True, reservation__in=bookings).values_list("reservation_id", flat=True)
    wanted = {}
    gres_types = _gres_types(bookings) if capabilities.typed_gpu_reservations else {}
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
                tres=_gpu_tres(gres_types.get(booking.pk, ""), booking.gpu_count)
                if capabilities.gpu_reservations and not booking.node.books_whole
                else "",
            ),
        )
    return wanted


def _gres_types(bookings: Any) -> dict[int, str]:
    """Each booking's GRES type, from its GPUs' model (the import names them "Slurm GPU (<type>)")."""
    models = Allocation.objects.filter(active=True, reservation__in=bookings).values_list(
        "reservation_id", "gpu__model"
    )
    return {booking_id: gres_type_of(model) for booking_id, model in models}


def _gpu_tres(gres_type: str, count: int) -> str:
    """The booking's GPUs on its node, for Slurm: ``gres/gpu:a100=2`` (25.05 on), or ``gres/gpu=2`` for untyped GRES
    and before 25.05 (the node's GPUs are of one type: the import reads one)."""
    return f"gres/gpu:{gres_type}={count}" if gres_type else f"gres/gpu={count}"


def reconcile(*, controller: Controller, capabilities: Capabilities, now: datetime) -> Pass:
    """One pass. SlurmUnreachable (the controller out of reach) propagates: before anything changed when it was so
    from the start; mid-pass, after what was done (the next pass does the rest), never recorded as a refusal."""
    try:
        actual = {item.name: item for item in controller.reservations() if item.is_ours}
    except SlurmUnreachable:
        raise
    except SlurmError as error:  # nothing can be done without knowing what it holds: as good as out of reach
        raise SlurmUnreachable(str(error)) from None
    wanted = wanted_reservations(capabilities=capabilities, now=now)
    done = Pass()
    for name, (booking_id, item) in wanted.items():
        have = actual.get(name)
        try:
            if have is not None and have.start <= now < item.start:
                # It has started, and should not have yet (Slurm cannot move a started reservation's start):
                # made anew, so that nobody holds the node before their slot.
                controller.delete(name)
                have = None
            if have is None:
                controller.create(item)
                done.created.append(name)
            elif _differs(have, item):
                controller.update(item)
                done.updated.append(name)
        except SlurmUnreachable:
            raise
        except SlurmError as refusal:
            done.refused[name] = str(refusal)
            _record(booking_id, name, SlurmReservation.State.REFUSED, str(refusal), now)
            continue
        _record(booking_id, name, SlurmReservation.State.SYNCED, "", now)
    for name in sorted(set(actual) - set(wanted)):
        try:
            gone = _remove(controller, actual[name], now)
        except SlurmUnreachable:
            raise
        except SlurmError as refusal:
            done.refused[name] = str(refusal)
            continue
        (done.deleted if gone else done.ended).append(name)
        record = SlurmReservation.objects.filter(name=name).first()
        if record is not None and record.state != SlurmReservation.State.REMOVED:
            _record(record.reservation_id, name, SlurmReservation.State.REMOVED, "", now)
    # Refused ones no longer wanted (their booking was cancelled or ended): there is nothing left to refuse.
    for record in SlurmReservation.objects.filter(state=SlurmReservation.State.REFUSED).exclude(name__in=wanted):
        _record(record.reservation_id, record.name, SlurmReservation.State.REMOVED, "", now)
    return done


def _remove(controller: Controller, have: Wanted, now: datetime) -> bool:
    """Delete one of the portal's reservations that no booking wants any more (cancelled, released, over). Slurm
    refuses while jobs use it: those waiting in it are moved out (they stay queued, as any other job of theirs), and
    if some still run, it is ended now instead (they keep the time limits they started with) and a later pass
    deletes it once they are gone. True when it is gone, False when it was ended."""
    try:
        controller.delete(have.name)
        return True
    except SlurmInUse:
        pass
    controller.release_jobs(have.name)
    try:
        controller.delete(have.name)
        return True
    except SlurmInUse:
        if have.start <= now < have.end:
            controller.update(replace(have, end=now))
        return False


def _differs(have: Wanted, want: Wanted) -> bool:
    # A running reservation's start is in the past and stays: only its end and users matter then.
    started = have.start <= want.start
    return have.end != want.end or set(have.users) != set(want.users) or (not started and have.start != want.start)


@transaction.atomic
def _record(booking_id: int, name: str, state: str, problem: str, now: datetime) -> None:
    """What Slurm said of a booking's reservation, announced when a refusal begins, changes or ends (alerts)."""
    before = (
        SlurmReservation.objects.select_for_update()
        .filter(reservation_id=booking_id)
        .values_list("state", "problem")
        .first()
    )
    SlurmReservation.objects.update_or_create(
        reservation_id=booking_id, defaults={"name": name, "state": state, "problem": problem, "synced_at": now}
    )
    if state == SlurmReservation.State.REFUSED and before != (state, problem):
        signals.reservation_refused.send(sender=SlurmReservation, reservation_id=booking_id, problem=problem, now=now)
    elif state != SlurmReservation.State.REFUSED and before is not None and before[0] == SlurmReservation.State.REFUSED:
        signals.reservation_settled.send(sender=SlurmReservation, reservation_id=booking_id, now=now)
