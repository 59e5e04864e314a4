"""What opens and resolves alerts: readings, agent events, silent nodes and late periodic jobs.

Each function is called by alerts' receivers (alerts/receivers.py) of what nodes announce
(nodes/signals.py), inside the report's transaction:
- telemetry (``telemetry_received`` -> ``alerts_evaluate_readings``): a GPU at or above
  ALERT_TEMPERATURE_C or its own slowdown threshold, uncorrected ECC errors. A condition read from
  readings opens on the BAD_READINGS_TO_OPEN-th bad reading in a row and resolves on the first good
  one. One read of the node's streaks per report; writes only when something is bad or changes.
- agent events (``node_events_recorded`` -> ``alerts_from_events``): a violation, a leftover, an
  unkillable process open at once (they are events by nature). Telemetry that no longer shows the
  user's processes on that GPU resolves a violation or leftover; "ended" resolves a leftover; a
  drained GPU's alert is resolved when it is emptied after all or returned to service
  (``gpu_returned`` -> ``alerts_gpu_returned``).
- ``nodes_went_offline`` -> ``alerts_nodes_offline``: a node just marked offline; its next report
  resolves it (``node_back_online`` -> ``alerts_node_online``).
- heartbeats (``node_reported`` -> ``alerts_check_jobs_if_due``): a periodic job of beat's schedule
  more than three periods late (alerts/jobs.py) opens "periodic jobs late", an alert with no node; it
  resolves once they all ran again. Heartbeats, not beat, check: beat may be what died.

Idle booked GPUs are checked by beat (alerts/idle.py).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from alerts.jobs import job_states
from alerts.models import Alert, AlertStreak
from alerts.records import Subject, alert_open, alerts_resolve
from nodes.ingest import TelemetryReport
from nodes.models import AgentState, Gpu, GpuTelemetry, Node, NodeEvent
from reservations.models import Reservation
from slurm.models import SlurmReservation

logger = logging.getLogger(__name__)

Kind = Alert.Kind
BAD_READINGS_TO_OPEN = 2
READING_KINDS = (Kind.TEMPERATURE, Kind.ECC)
# Alerts opened by an event that telemetry clears: no process of that user left on the GPU.
PROCESS_KINDS = (Kind.VIOLATION, Kind.LEFTOVER)
EVENT_KINDS: dict[str, str] = {NodeEvent.Kind.VIOLATION: Kind.VIOLATION, NodeEvent.Kind.LEFTOVER: Kind.LEFTOVER}


# --- telemetry ------------------------------------------------------------------------------------


def _too_hot(reading: GpuTelemetry) -> bool | None:
    if reading.temperature_c is None:
        return None
    limit = settings.ALERT_TEMPERATURE_C
    if reading.slowdown_temperature_c is not None:
        limit = min(limit, reading.slowdown_temperature_c)
    return reading.temperature_c >= limit


def _ecc(reading: GpuTelemetry) -> bool | None:
    return None if reading.ecc_errors_uncorrected is None else reading.ecc_errors_uncorrected > 0


def _sample(reading: GpuTelemetry, kind: str) -> dict[str, Any]:
    if kind == Kind.TEMPERATURE:
        values = {"temperature_c": reading.temperature_c, "slowdown_temperature_c": reading.slowdown_temperature_c}
    else:
        values = {"ecc_errors_uncorrected": reading.ecc_errors_uncorrected}
    return {"at": reading.at.isoformat(), **values}


RESOLVED_BY_READING: dict[str, str] = {
    Kind.TEMPERATURE: "temperature back under the limit",
    Kind.ECC: "no uncorrected ECC errors reported",
    Kind.VIOLATION: "no process of that user on the GPU any more",
    Kind.LEFTOVER: "no process of that user on the GPU any more",
}


def alerts_evaluate_reports(reports: Sequence[TelemetryReport]) -> None:
    """Telemetry reports, oldest first, against their nodes' streaks. A report with no bad reading, of
    a node with no streak, can change nothing: one query finds the nodes with streaks, and only
    their reports and those with a bad reading are looked at one by one."""
    watched = set(
        AlertStreak.objects.filter(node__in={report.node for report in reports})
        .values_list("node_id", flat=True)
        .distinct()
    )
    for report in reports:
        if report.node.pk in watched or any(_too_hot(r) or _ecc(r) for r in report.readings):
            alerts_evaluate_readings(node=report.node, readings=report.readings, now=report.now)
            watched.add(report.node.pk)


def alerts_evaluate_readings(*, node: Node, readings: Sequence[GpuTelemetry], now: datetime) -> None:
    """The readings of one telemetry report, against the node's streaks (one query). Nothing is
    written unless a reading is bad or a watched condition cleared."""
    streaks = {(s.kind, s.gpu_id, s.username): s for s in AlertStreak.objects.filter(node=node)}
    new: list[AlertStreak] = []
    bumped: list[AlertStreak] = []
    ongoing: list[AlertStreak] = []
    cleared: list[AlertStreak] = []
    to_open: list[AlertStreak] = []
    for reading in readings:
        for kind, bad in ((Kind.TEMPERATURE, _too_hot(reading)), (Kind.ECC, _ecc(reading))):
            streak = streaks.get((kind, reading.gpu_id, ""))
            if bad:
                if streak is not None and streak.count >= BAD_READINGS_TO_OPEN:
                    ongoing.append(streak)  # its alert is open: only the alert's last bad moment moves
                    continue
                if streak is None:
                    streak = AlertStreak(kind=kind, node=node, gpu_id=reading.gpu_id, count=0, readings=[])
                    new.append(streak)
                else:
                    bumped.append(streak)
                streak.count += 1
                streak.readings = [*streak.readings[: BAD_READINGS_TO_OPEN - 1], _sample(reading, kind)]
                if streak.count == BAD_READINGS_TO_OPEN:
                    to_open.append(streak)
            elif bad is False and streak is not None:
                cleared.append(streak)
    if any(s.kind in PROCESS_KINDS for s in streaks.values()):
        users = {
            reading.gpu_id: {p.get("user") for p in reading.processes or [] if isinstance(p, dict)}
            for reading in readings
        }
        for streak in streaks.values():
            if streak.kind in PROCESS_KINDS and streak.gpu_id in users and streak.username not in users[streak.gpu_id]:
                cleared.append(streak)
    if not (new or bumped or ongoing or cleared):
        return
    with transaction.atomic():
        if new:
            AlertStreak.objects.bulk_create(new, ignore_conflicts=True)
        if bumped:
            AlertStreak.objects.bulk_update(bumped, ["count", "readings"])
        if ongoing:
            subjects = Q()
            for s in ongoing:
                subjects |= Q(kind=s.kind, gpu_id=s.gpu_id)
            Alert.objects.filter(subjects, node=node, username="", resolved_at__isnull=True).update(last_bad_at=now)
        for streak in to_open:
            details = {"readings": streak.readings}
            if streak.kind == Kind.TEMPERATURE:
                details["limit_c"] = settings.ALERT_TEMPERATURE_C
            alert_open(subject=Subject(streak.kind, node.pk, streak.gpu_id), now=now, details=details)
        if cleared:
            AlertStreak.objects.filter(pk__in=[s.pk for s in cleared]).delete()
            for streak in cleared:
                alerts_resolve(
                    Subject(streak.kind, node.pk, streak.gpu_id, streak.username).open_alerts(),
                    now=now,
                    resolution=RESOLVED_BY_READING[streak.kind],
                )


# --- agent events ---------------------------------------------------------------------------------


def alerts_from_events(*, node: Node, events: Iterable[NodeEvent], now: datetime) -> None:
    """Violations, leftovers, unkillable processes and refused accounts open an alert at once (one
    per GPU and user while open); "ended", "emptied after all" and a later grant resolve them."""
    for event in events:
        kind = EVENT_KINDS.get(event.kind)
        subject_user = event.user[:32]
        if kind is not None:
            subject = Subject(kind, node.pk, event.gpu_id, subject_user)
            opened = alert_open(subject=subject, now=now, details=_event_details(event))
            if opened is not None and event.gpu_id is not None:
                AlertStreak.objects.get_or_create(
                    kind=kind,
                    gpu_id=event.gpu_id,
                    username=subject_user,
                    defaults={"node": node, "count": 0},
                )
        elif event.kind == NodeEvent.Kind.UNKILLABLE:
            alert_open(subject=Subject(Kind.UNKILLABLE, node.pk, event.gpu_id), now=now, details=_event_details(event))
        elif event.kind == NodeEvent.Kind.ENDED:
            leftover = Subject(Kind.LEFTOVER, node.pk, event.gpu_id, subject_user)
            _stop_watching(leftover)
            alerts_resolve(leftover.open_alerts(), now=now, resolution="the leftover processes were ended")
        elif event.kind == NodeEvent.Kind.DRAIN_CLEARED:
            alerts_resolve(
                Subject(Kind.UNKILLABLE, node.pk, event.gpu_id).open_alerts(), now=now, resolution="the GPU was emptied"
            )
        elif event.kind == NodeEvent.Kind.LEASE_REFUSED and event.reservation_id is not None and event.gpu_id is None:
            # The node will not give this account a GPU (no such account there, or a system one; a refusal
            # that names a GPU is about the GPU, a MIG slice whose card's MIG mode is off, not the account):
            # the booking holds its slot but opens nothing, so an admin must fix the binding. Only a
            # refusal of a lease the portal sent this node counts (its booking, its holder's name),
            # so a hostile node cannot open alerts for names nobody booked with.
            booking = (
                Reservation.objects.filter(pk=event.reservation_id, node=node, user__unix_username=subject_user)
                .values_list("pk", flat=True)
                .first()
            )
            if booking is not None:
                alert_open(
                    subject=Subject(Kind.ACCOUNT_REFUSED, node.pk, None, subject_user),
                    now=now,
                    details=_event_details(event),
                    reservation_id=booking,
                )
        elif event.kind == NodeEvent.Kind.GRANTED and subject_user:
            alerts_resolve(
                Subject(Kind.ACCOUNT_REFUSED, node.pk, None, subject_user).open_alerts(),
                now=now,
                resolution="the node gave that account a GPU after all",
            )


def _event_details(event: NodeEvent) -> dict[str, Any]:
    return {
        "event": {
            "kind": event.kind,
            "at": event.at.isoformat(),
            "user": event.user,
            "reservation": event.reservation_id,
            "message": event.message,
            **event.details,
        }
    }


def _stop_watching(subject: Subject) -> None:
    AlertStreak.objects.filter(kind=subject.kind, gpu=subject.gpu_id, username=subject.username).delete()


def alerts_gpu_returned(*, gpu: Gpu, actor: Any) -> None:
    """An admin returned a drained GPU to service: its "could not be emptied" alert is over."""
    alerts_resolve(
        Subject(Kind.UNKILLABLE, gpu.node_id, gpu.pk).open_alerts(),
        now=timezone.now(),
        resolution="returned to service",
        actor=actor,
    )


# --- offline nodes --------------------------------------------------------------------------------


def alerts_nodes_offline(*, node_ids: Sequence[int], now: datetime) -> None:
    """Nodes ``refresh_status`` just marked offline (those still marked at ``now``)."""
    for state in AgentState.objects.filter(node_id__in=node_ids, offline_since=now):
        alert_open(
            subject=Subject(Kind.OFFLINE, state.node_id),
            now=now,
            details={"last_seen": state.last_seen.isoformat()},
        )


def alerts_node_online(*, node: Node, now: datetime) -> None:
    """The node reported again (cheap: runs only when a node comes back)."""
    alerts_resolve(Subject(Kind.OFFLINE, node.pk).open_alerts(), now=now, resolution="the node reported again")


# --- a Slurm cluster's controller out of reach -------------------------------------------------------

SLURM_UNREACHABLE = Subject(Kind.SLURM_UNREACHABLE, None)


def alerts_slurm_unreachable(*, since: datetime, problem: str, now: datetime) -> None:
    """A reconcile pass could not reach the Slurm controller (slurm.signals): an alert once it has been so for
    SLURM_UNREACHABLE_ALERT_MINUTES, every pass after that moving its last bad moment. Bookings still commit
    meanwhile; the passes catch up once it answers."""
    if now - since < timedelta(minutes=settings.SLURM_UNREACHABLE_ALERT_MINUTES):
        return
    details = {"since": since.isoformat(), "seconds": round((now - since).total_seconds()), "problem": problem}
    if alert_open(subject=SLURM_UNREACHABLE, now=now, details=details) is None:
        SLURM_UNREACHABLE.open_alerts().update(details=details)


def alerts_slurm_reached(*, now: datetime) -> None:
    alerts_resolve(SLURM_UNREACHABLE.open_alerts(), now=now, resolution="the Slurm controller answered again")


def alerts_slurm_refused(*, reservation_id: int, problem: str, now: datetime) -> None:
    """Slurm refused a booking's reservation: the holder's slot is not enforced, which admins must hear of (the
    holder sees it on the booking's page). One alert per node and holder: their latest refused booking."""
    booking = Reservation.objects.select_related("user").filter(pk=reservation_id).first()
    if booking is None:
        return
    subject = Subject(Kind.SLURM_REFUSED, booking.node_id, username=booking.user.unix_username or "")
    details = {"reservation": reservation_id, "problem": problem}
    if alert_open(subject=subject, now=now, details=details, reservation_id=reservation_id) is None:
        subject.open_alerts().update(details=details, reservation_id=reservation_id)


def alerts_slurm_settled(*, reservation_id: int, now: datetime) -> None:
    """A refused booking's reservation is in Slurm now, or no longer wanted. Its alert names another booking of the
    same holder on the same node that Slurm still refuses, if there is one; else it is resolved."""
    alerts = Alert.objects.filter(kind=Kind.SLURM_REFUSED, reservation_id=reservation_id, resolved_at__isnull=True)
    booking = Reservation.objects.filter(pk=reservation_id).first()
    if booking is None or not alerts.exists():
        return
    still = (
        SlurmReservation.objects.filter(
            state=SlurmReservation.State.REFUSED,
            reservation__node_id=booking.node_id,
            reservation__user_id=booking.user_id,
        )
        .exclude(reservation_id=reservation_id)
        .order_by("-synced_at")
        .first()
    )
    if still is not None:
        details = {"reservation": still.reservation_id, "problem": still.problem}
        alerts.update(reservation_id=still.reservation_id, details=details)
        return
    alerts_resolve(alerts, now=now, resolution="Slurm holds the reservation now, or the booking no longer needs one")


# --- periodic jobs late ---------------------------------------------------------------------------

JOBS_LATE = Subject(Kind.JOBS_LATE, None)
# When this process last checked (alerts_check_jobs_if_due): a heartbeat every few seconds per node
# must not cost a query each.
_jobs_checked_at: datetime | None = None


def alerts_check_jobs_if_due(*, now: datetime) -> None:
    """``alerts_check_jobs``, at most every JOBS_LATE_CHECK_SECONDS in this process. Called by every
    agent heartbeat; a failure is logged and never fails the heartbeat."""
    global _jobs_checked_at
    checked = _jobs_checked_at
    if checked is not None and checked <= now < checked + timedelta(seconds=settings.JOBS_LATE_CHECK_SECONDS):
        return
    _jobs_checked_at = now
    try:
        with transaction.atomic():
            alerts_check_jobs(now=now)
    except Exception:
        logger.exception("could not check the periodic jobs")


def alerts_check_jobs(*, now: datetime) -> Alert | None:
    """Open "periodic jobs late" while any job of beat's schedule is late (alerts/jobs.py), naming
    them, and resolve it once none is. Returns the alert if this call opened it. Two queries when all
    is well."""
    late = [state for state in job_states(now=now, watch_new=True) if state.is_late(now)]
    if not late:
        alerts_resolve(JOBS_LATE.open_alerts(), now=now, resolution="the periodic jobs ran again")
        return None
    details = {
        "jobs": [
            {
                "name": state.name,
                "task": state.task,
                "period_seconds": state.period.total_seconds(),
                "last_success_at": state.last_success_at.isoformat() if state.last_success_at else None,
                # A late job has waited: waited() is None only for a job never seen to run or watched.
                "waited_seconds": round((state.waited(now) or timedelta(0)).total_seconds()),
            }
            for state in late
        ]
    }
    # Open already: which jobs are late may have changed.
    if JOBS_LATE.open_alerts().update(last_bad_at=now, details=details):
        return None
    return alert_open(subject=JOBS_LATE, now=now, details=details)
