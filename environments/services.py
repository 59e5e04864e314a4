"""Launching environments in bookings, stopping them, and taking the node's word on them (issue 22).

Only the booking's holder launches in it: the environment runs as their unix account with their GPUs, and its
notebook token is theirs. The holder or a booking admin stops it. A launch reaches the node in the booking's
lease (reservations/leases.py, ``lease_additions``): a change here asks for a push of the node's snapshot once it
commits, as a booking change does. The node answers in its heartbeats (``launches_record``), where each launch
it knows comes with its state, its output's tail and, for a notebook, its socket or port and its token once the node
has seen it serve there (issue 36).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from audit.services import audit_record
from environments.models import Environment, Launch
from gpubook_agent.protocol import LAUNCH_TAIL_CHARS, MAX_LAUNCHES
from nodes.models import Node
from reservations.exceptions import InvalidBooking, InvalidState, NotAllowed
from reservations.models import Reservation
from reservations.pushes import request_push

State = Launch.State
# What the node reports -> the portal's state. A launch the node refused, or that exited or was stopped, is over.
NODE_STATES = {
    "waiting": State.REQUESTED,  # its slot is yet to come; the message says whether its image is ready
    "starting": State.STARTING,
    "running": State.RUNNING,
    "exited": State.EXITED,
    "stopped": State.STOPPED,
    "refused": State.REFUSED,
}
FINAL_STATES = frozenset({State.EXITED, State.STOPPED, State.REFUSED})
# Launches one booking may have in all, running or ended: every one is a row, a log on the node and its events.
MAX_LAUNCHES_PER_BOOKING = 20
# How long after its booking's end a launch the node never reported ended is closed by the portal.
OVERDUE = timedelta(minutes=10)
# Reports only move a launch forward: a heartbeat sent before a change and delivered after it changes nothing.
PROGRESS = {State.REQUESTED: 0, State.STARTING: 1, State.RUNNING: 2, **dict.fromkeys(FINAL_STATES, 3)}


def launch_create(*, user: Any, reservation: Reservation, environment: Environment) -> Launch:
    """Ask the booking's node to run ``environment`` for the booking's holder while the slot lasts: at once when
    the slot runs, at its start when it is still to come."""
    now = timezone.now()
    if reservation.user_id != user.pk:
        raise NotAllowed(
            "Only the booking's holder can launch an environment in it: it runs as their account, on their GPUs."
        )
    if not environment.enabled:
        raise InvalidBooking(f"The environment {environment.name!r} is switched off: pick another one.")
    if reservation.node.manager != Node.Manager.AGENT:
        raise InvalidState(
            f"Node {reservation.node.name} is managed by Slurm: run your environment as a Slurm job in the booking's "
            "reservation (its page says how); launches run where the portal's agent runs."
        )
    with transaction.atomic():
        locked = Reservation.objects.select_for_update().get(pk=reservation.pk)  # numbers launches one at a time
        if locked.status not in Reservation.LIVE_STATUSES or locked.end <= now:
            raise InvalidState(
                f"Booking #{locked.pk} is {'over' if locked.end <= now else locked.get_status_display().lower()}: "
                "an environment runs only within a live booking's slot."
            )
        launches = list(Launch.objects.filter(reservation=locked))
        if len(launches) >= MAX_LAUNCHES_PER_BOOKING:
            raise InvalidState(
                f"Booking #{locked.pk} has had {len(launches)} launches, the most one booking may: book again for more."
            )
        running = [launch for launch in launches if launch.is_open and launch.stop_requested_at is None]
        if len(running) >= MAX_LAUNCHES:
            raise InvalidState(
                f"Booking #{locked.pk} runs {len(running)} environments already, the most one booking may: stop one "
                "first."
            )
        launch = Launch.objects.create(
            reservation=locked,
            number=max((launch.number for launch in launches), default=0) + 1,
            environment=environment,
            requested_by=user,
            requested_at=now,
        )
        audit_record(actor=user, action="launch.create", target=launch, after=_audited(launch))
        _push_on_commit(locked.node_id)
    return launch


def launch_stop(*, actor: Any, launch: Launch) -> Launch:
    """Ask the node to end the launch (and everything it started). Its holder or a booking admin may."""
    if actor.pk != launch.reservation.user_id and not actor.is_booking_admin:
        raise NotAllowed("Only the booking's holder or an admin can stop its environments.")
    with transaction.atomic():
        locked = Launch.objects.select_for_update().get(pk=launch.pk)
        if not locked.is_open:
            raise InvalidState(f"This environment is {locked.get_state_display().lower()} already.")
        if locked.stop_requested_at is not None:
            return locked  # asked already: the node is on it
        before = _audited(locked)
        locked.stop_requested_at, locked.stop_requested_by = timezone.now(), actor
        if locked.state == State.REQUESTED:  # the node never started it: nothing to wait for
            locked.state, locked.ended_at, locked.message = (
                State.STOPPED,
                locked.stop_requested_at,
                "stopped before it started",
            )
        locked.save()
        audit_record(actor=actor, action="launch.stop", target=locked, before=before, after=_audited(locked))
        _push_on_commit(launch.reservation.node_id)
    return locked


def launches_end_with_booking(*, reservation: Reservation, now: datetime) -> int:
    """The booking ended before the node started these (cancelled, rejected, released early): they never will."""
    return Launch.objects.filter(reservation=reservation, state=State.REQUESTED).update(
        state=State.STOPPED, ended_at=now, message=f"the booking was {reservation.get_status_display().lower()}"
    )


def launches_close_overdue(*, now: datetime) -> int:
    """Beat: launches still open in the portal OVERDUE after their booking ended (or stopped being live) are marked
    stopped. The node ends them at the slot's end whatever the portal knows; this is for a node that went silent
    or stopped before it could say so. Idempotent; returns how many were closed."""
    # A booking cancelled or rejected early: its node says so within seconds, unless it is silent for OVERDUE.
    silent = Q(reported_at__lte=now - OVERDUE) | Q(reported_at=None, requested_at__lte=now - OVERDUE)
    overdue = Launch.objects.filter(state__in=Launch.OPEN_STATES).filter(
        Q(reservation__end__lte=now - OVERDUE) | (~Q(reservation__status__in=Reservation.LIVE_STATUSES) & silent)
    )
    return overdue.update(
        state=State.STOPPED,
        ended_at=now,
        token="",
        message="the booking is over and its node has not said how this ended (the node ends it at the slot's end)",
    )


def launches_record(*, node: Node, statuses: Iterable[Mapping[str, Any]], now: datetime) -> int:
    """Take a heartbeat's ``launches``: each launch the node knows, with its state. A node speaks only for the
    launches of bookings on itself; anything else is ignored. Returns how many launches changed."""
    by_key = {(item["reservation"], item["number"]): item for item in statuses}
    if not by_key:
        return 0
    changed = 0
    with transaction.atomic():
        # Only the launch rows (of=self): a join's FOR UPDATE would lock the bookings too, and a cancellation that
        # holds its booking and then ends its launches would wait on us while we wait on it.
        launches = Launch.objects.select_for_update(of=("self",)).filter(
            reservation__node=node, reservation_id__in={key[0] for key in by_key}
        )
        for launch in launches:
            item = by_key.get((launch.reservation_id, launch.number))
            if item is not None and _take(launch, item, now):
                changed += 1
    return changed


def _take(launch: Launch, item: Mapping[str, Any], now: datetime) -> bool:
    """Apply one status report to ``launch``; whether anything people see changed. Reports move a launch forward
    only: a late heartbeat that still says "running" does not bring an ended launch back, and a final state is
    final."""
    state = NODE_STATES[item["state"]]
    if PROGRESS[state] < PROGRESS[State(launch.state)] or (launch.state in FINAL_STATES and state != launch.state):
        return False
    fields = {
        "state": state,
        "exit_code": item.get("exit_code"),
        "message": item.get("message") or "",
        "port": item.get("port"),
        "socket": item.get("socket") or "",
        "token": item.get("token") or "",
        "log_tail": (item.get("tail") or "")[-LAUNCH_TAIL_CHARS:],
    }
    if fields["token"]:  # the agent masks it already; an older or odd one must not show it to admins either
        fields["log_tail"] = str(fields["log_tail"]).replace(str(fields["token"]), "<token>")
    ran = state in (State.RUNNING, State.EXITED) or (state == State.STOPPED and launch.state != State.REQUESTED)
    if ran and launch.started_at is None:
        fields["started_at"] = now
    if state in FINAL_STATES:
        fields["token"] = ""  # the notebook is gone: its key need not be kept
        if launch.ended_at is None:
            fields["ended_at"] = now
    changed = any(getattr(launch, name) != value for name, value in fields.items())
    for name, value in fields.items():
        setattr(launch, name, value)
    launch.reported_at = now
    launch.save()
    return changed


def _audited(launch: Launch) -> dict[str, Any]:
    return {
        "reservation": launch.reservation_id,
        "number": launch.number,
        "environment": launch.environment.name,
        "state": launch.state,
        "stop_requested": launch.stop_requested_at is not None,
    }


def _push_on_commit(node_id: int) -> None:
    transaction.on_commit(lambda: request_push(node_id))
