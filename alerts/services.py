"""Opening and resolving alerts, and telling people about them.

Where alerts come from (each hook is a call from the code that already knows):
- telemetry (``nodes.reports.telemetry_record`` -> ``alerts_evaluate_readings``): a GPU at or above
  ALERT_TEMPERATURE_C or its own slowdown threshold, uncorrected ECC errors. A condition read from
  readings opens on the BAD_READINGS_TO_OPEN-th bad reading in a row and resolves on the first good
  one. One read of the node's streaks per report; writes only when something is bad or changes.
- agent events (``nodes.reports.agent_events_record`` -> ``alerts_from_events``): a violation, a
  leftover, an unkillable process open at once (they are events by nature). Telemetry that no
  longer shows the user's processes on that GPU resolves a violation or leftover; "ended" resolves
  a leftover; a drained GPU's alert is resolved when it is emptied after all or returned to service.
- ``nodes.status.refresh_status`` -> ``alerts_nodes_offline``: a node just marked offline; its next
  report resolves it (``alerts_node_online``).
- beat -> ``alerts_check_idle``: booked GPUs idle for ALERT_IDLE_MINUTES: the holder is told, and
  with IDLE_AUTO_RELEASE_MINUTES set the booking is released. Both mails go through the mail outbox
  (notifications/), written in the transaction that decides them.
- ``nodes.reports.agent_heartbeat_record`` -> ``alerts_check_jobs_if_due``: a periodic job of beat's
  schedule more than three periods late (alerts/jobs.py) opens "periodic jobs late", an alert with no
  node; it resolves once they all ran again. Heartbeats, not beat, check: beat may be what died.

Staff mail (``alerts_mail_staff``) runs after an alert opens and on every beat: every alert is
mailed at least once (claimed by a compare-and-swap on ``notified_at``, confirmed by ``mailed_at``;
a claim left by a sender that died is taken again after NOTIFY_CLAIM_SECONDS), at most
ALERT_MAILS_PER_KIND_PER_HOUR mails per kind per hour; past that, alerts wait and go together in one
summary once the hour allows.
"""

from __future__ import annotations

import logging
import math
import uuid
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from types import SimpleNamespace
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.db.models import Count, Q, QuerySet, Sum
from django.utils import timezone

from alerts.jobs import job_states
from alerts.models import Alert, AlertStreak
from alerts.selectors import alert_data
from audit.services import audit_record
from kernel.locks import advisory_xact_lock
from live import broadcast
from nodes.models import AgentState, Gpu, GpuMinute, GpuTelemetry, Node, NodeEvent
from nodes.usage import busy_minutes
from notifications.hooks import send_after_commit
from notifications.mail import send_templated
from notifications.models import Kind as MailKind
from notifications.services import notification_enqueue
from reservations.models import Allocation, Reservation

logger = logging.getLogger(__name__)

Kind = Alert.Kind
BAD_READINGS_TO_OPEN = 2
READING_KINDS = (Kind.TEMPERATURE, Kind.ECC)
# Alerts opened by an event that telemetry clears: no process of that user left on the GPU.
PROCESS_KINDS = (Kind.VIOLATION, Kind.LEFTOVER)
EVENT_KINDS = {NodeEvent.Kind.VIOLATION: Kind.VIOLATION, NodeEvent.Kind.LEFTOVER: Kind.LEFTOVER}
# Idle GPUs are the holder's business: they are shown to admins, never mailed to them.
STAFF_MAIL_KINDS = tuple(kind for kind in Kind if kind != Kind.IDLE)
# An idle window must have been reported for this share of its minutes (a silent node is not idle).
IDLE_COVERAGE = 0.9
# An alert not mailed this long after it opened waited (rate limit, mail or worker down): it goes
# in a summary with the others that waited, not in a mail of its own.
MAIL_WAITED = timedelta(minutes=2)
# Who releases idle bookings: the portal itself (the audit trail shows no person).
PORTAL = SimpleNamespace(pk=None, is_booking_admin=True)


@dataclass(frozen=True)
class Subject:
    kind: str
    node_id: int | None  # None: the portal itself (periodic jobs late)
    gpu_id: int | None = None
    username: str = ""

    def open_alerts(self) -> QuerySet[Alert]:
        return Alert.objects.filter(
            kind=self.kind, node_id=self.node_id, gpu_id=self.gpu_id, username=self.username, resolved_at__isnull=True
        )


# --- opening and resolving ----------------------------------------------------------------------


def alert_open(
    *, subject: Subject, now: datetime, details: dict[str, Any], reservation_id: int | None = None
) -> Alert | None:
    """Open an alert for ``subject`` unless one is open (then only its last bad moment moves).
    Returns the new alert, or None. The partial unique constraint decides, so two evaluations at
    once open it once."""
    if subject.open_alerts().update(last_bad_at=now):
        return None
    user = get_user_model().objects.filter(unix_username=subject.username).first() if subject.username else None
    try:
        with transaction.atomic():
            alert = Alert.objects.create(
                kind=subject.kind,
                node_id=subject.node_id,
                gpu_id=subject.gpu_id,
                username=subject.username,
                user=user,
                reservation_id=reservation_id,
                opened_at=now,
                last_bad_at=now,
                details=details,
            )
    except IntegrityError:
        subject.open_alerts().update(last_bad_at=now)
        return None
    _announce([alert.pk], mail=alert.kind in STAFF_MAIL_KINDS)
    return alert


def alerts_resolve(alerts: QuerySet[Alert], *, now: datetime, resolution: str, actor: Any | None = None) -> list[int]:
    """Resolve the open alerts among ``alerts``; returns the ids this call resolved."""
    ids = list(alerts.filter(resolved_at__isnull=True).values_list("pk", flat=True))
    if not ids:
        return []
    resolved = []
    for pk in ids:  # a compare-and-swap each: whoever resolves it first says how
        if Alert.objects.filter(pk=pk, resolved_at__isnull=True).update(
            resolved_at=now, resolution=resolution[:200], resolved_by=actor if getattr(actor, "pk", None) else None
        ):
            resolved.append(pk)
    if resolved:
        _announce(resolved, mail=False)
    return resolved


def alert_resolve_by_admin(*, alert: Alert, actor: Any) -> bool:
    """An admin's "resolve": a drained GPU goes back to service (which resolves its alert, audited
    as the GPU's return); anything else is closed as handled. True if this call resolved it."""
    with transaction.atomic():
        if alert.kind == Kind.UNKILLABLE and alert.gpu is not None and alert.gpu.drained_at is not None:
            from nodes.reports import gpu_return_to_service

            if gpu_return_to_service(gpu=alert.gpu, actor=actor):
                return Alert.objects.filter(pk=alert.pk, resolved_by=actor, resolved_at__isnull=False).exists()
        done = alerts_resolve(
            Alert.objects.filter(pk=alert.pk), now=timezone.now(), resolution="resolved by an admin", actor=actor
        )
        if done:
            audit_record(actor=actor, action="alert.resolve", target=alert, after={"kind": alert.kind})
    return bool(done)


def _announce(alert_ids: list[int], *, mail: bool) -> None:
    """After commit: the alerts' new state to the admins' status pages; staff mail for new ones."""

    def send() -> None:
        try:
            alerts = list(Alert.objects.filter(pk__in=alert_ids).select_related("node", "gpu"))
            broadcast.send_alerts({"type": "alerts", "alerts": [alert_data(alert) for alert in alerts]})
        except Exception:  # a broadcast never fails what caused it
            logger.exception("alerts %s not broadcast", alert_ids)
        if mail:
            from alerts.tasks import mail_staff

            try:
                mail_staff.apply_async(expires=300)
            except Exception:  # broker away: beat's next run sends it
                logger.exception("staff mail for alerts %s not queued; beat will send it", alert_ids)

    transaction.on_commit(send)


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


RESOLVED_BY_READING = {
    Kind.TEMPERATURE: "temperature back under the limit",
    Kind.ECC: "no uncorrected ECC errors reported",
    Kind.VIOLATION: "no process of that user on the GPU any more",
    Kind.LEFTOVER: "no process of that user on the GPU any more",
}


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
        kind = EVENT_KINDS.get(event.kind)  # type: ignore[call-overload]
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
        elif event.kind == NodeEvent.Kind.LEASE_REFUSED:
            # The node will not give this account a GPU (no such account there, or a system one):
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
    AlertStreak.objects.filter(kind=subject.kind, gpu_id=subject.gpu_id, username=subject.username).delete()


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
                "waited_seconds": round(state.waited(now).total_seconds()),  # type: ignore[union-attr]
            }
            for state in late
        ]
    }
    # Open already: which jobs are late may have changed.
    if JOBS_LATE.open_alerts().update(last_bad_at=now, details=details):
        return None
    return alert_open(subject=JOBS_LATE, now=now, details=details)


# --- idle booked GPUs -----------------------------------------------------------------------------


@dataclass
class IdleRun:
    opened: list[int] = field(default_factory=list)
    resolved: list[int] = field(default_factory=list)
    holders_told: list[int] = field(default_factory=list)
    released: list[int] = field(default_factory=list)


def alerts_check_idle(*, now: datetime) -> IdleRun:
    """Beat: GPUs held by a running booking whose every reported minute of the last
    ALERT_IDLE_MINUTES stayed under ALERT_IDLE_UTILIZATION_PCT (mean of the minute's samples).
    Idempotent: what it opens is unique while open, and each mail is claimed by a compare-and-swap."""
    run = IdleRun()
    minutes = settings.ALERT_IDLE_MINUTES
    pct = settings.ALERT_IDLE_UTILIZATION_PCT
    window_end = now.replace(second=0, microsecond=0)
    window_start = window_end - timedelta(minutes=minutes)
    running = {
        a.gpu_id: a
        for a in Allocation.objects.filter(
            active=True, start__lte=now, end__gt=now, reservation__status=Reservation.Status.APPROVED
        ).select_related("reservation__user", "gpu__node")
    }
    stats = (
        GpuMinute.objects.filter(
            gpu_id__in=list(running), minute__gte=window_start, minute__lt=window_end, utilization_samples__gt=0
        )
        .values("gpu_id")
        .annotate(
            minutes=Count("pk"),
            busy=Count("pk", filter=busy_minutes(pct)),
            total=Sum("utilization_sum"),
            samples=Sum("utilization_samples"),
        )
    )
    needed = math.ceil(minutes * IDLE_COVERAGE)
    idle, busy = {}, set()
    for stat in stats:
        if stat["busy"]:
            busy.add(stat["gpu_id"])
        elif stat["minutes"] >= needed and running[stat["gpu_id"]].start <= window_start:
            idle[stat["gpu_id"]] = stat

    open_idle = {a.gpu_id: a for a in Alert.objects.filter(kind=Kind.IDLE, resolved_at__isnull=True)}
    for gpu_id, alert in open_idle.items():
        allocation = running.get(gpu_id)  # type: ignore[arg-type]
        if allocation is None or allocation.reservation_id != alert.reservation_id:
            reason = "the slot ended"
        elif gpu_id in busy:
            reason = "the GPU is in use again"
        else:
            continue
        run.resolved += alerts_resolve(Alert.objects.filter(pk=alert.pk), now=now, resolution=reason)

    for gpu_id, stat in idle.items():
        allocation = running[gpu_id]
        holder = allocation.reservation.user
        alert = alert_open(
            subject=Subject(Kind.IDLE, allocation.gpu.node_id, gpu_id, holder.unix_username or holder.get_username()),
            now=now,
            reservation_id=allocation.reservation_id,
            details={
                "reservation": allocation.reservation_id,
                "minutes": stat["minutes"],
                "mean_utilization_pct": round(stat["total"] / stat["samples"], 1),
                "limit_pct": pct,
            },
        )
        if alert is not None:
            run.opened.append(alert.pk)

    run.holders_told = _tell_idle_holders(now)
    if settings.IDLE_AUTO_RELEASE_MINUTES > 0:
        run.released = _release_idle(now)
    return run


def _tell_idle_holders(now: datetime) -> list[int]:
    """One mail per booking naming its idle GPUs; each GPU of a booking is told about once. The mail
    is written to the outbox in the transaction that marks its alerts told, so it goes at least once."""
    pending = list(
        Alert.objects.filter(
            kind=Kind.IDLE, resolved_at__isnull=True, holder_notified_at__isnull=True, reservation__isnull=False
        ).select_related("node", "gpu", "reservation__user")
    )
    told_before = set(
        Alert.objects.filter(
            kind=Kind.IDLE, reservation_id__in=[a.reservation_id for a in pending], holder_notified_at__isnull=False
        ).values_list("reservation_id", "gpu_id")
    )
    by_reservation: dict[int, list[Alert]] = defaultdict(list)
    for alert in pending:
        by_reservation[alert.reservation_id].append(alert)  # type: ignore[index]
    told = []
    for reservation_id, alerts in by_reservation.items():
        with transaction.atomic():
            fresh = []
            for alert in alerts:
                claim = Alert.objects.filter(pk=alert.pk, holder_notified_at__isnull=True)
                if (reservation_id, alert.gpu_id) in told_before:
                    claim.update(holder_notified_at=now)  # this GPU of this booking was told once already
                elif claim.update(holder_notified_at=now):
                    fresh.append(alert)
            if not fresh:
                continue
            reservation = fresh[0].reservation
            assert reservation is not None
            notification_enqueue(
                kind=MailKind.IDLE,
                reservation=reservation,
                users=[reservation.user],
                moment=now,
                context=_idle_mail_context(fresh, now),
            )
            send_after_commit(reservation_id)
        told.append(reservation_id)
    return told


def _idle_mail_context(alerts: list[Alert], now: datetime) -> dict[str, Any]:
    """What an idle mail says (JSON, kept with the mail in the outbox; notifications renders it)."""
    auto = settings.IDLE_AUTO_RELEASE_MINUTES
    gpus = sorted(a.gpu.index for a in alerts if a.gpu is not None)
    return {
        "gpus": gpus,
        "gpu_list": ", ".join(f"GPU {index}" for index in gpus),
        "minutes": settings.ALERT_IDLE_MINUTES,
        "limit_pct": settings.ALERT_IDLE_UTILIZATION_PCT,
        "release_minutes": auto,
        "release_at": (now + timedelta(minutes=auto)).isoformat() if auto > 0 else "",
    }


def _release_idle(now: datetime) -> list[int]:
    """Bookings whose every running GPU stayed idle IDLE_AUTO_RELEASE_MINUTES after the holder was
    told are released (reservations.services.reservation_release, audited with the reason)."""
    from reservations.exceptions import BookingError
    from reservations.services import reservation_release

    cutoff = now - timedelta(minutes=settings.IDLE_AUTO_RELEASE_MINUTES)
    due = Alert.objects.filter(
        kind=Kind.IDLE, resolved_at__isnull=True, released_at__isnull=True, holder_notified_at__lte=cutoff
    )
    released = []
    for reservation_id in set(due.values_list("reservation_id", flat=True)):
        reservation = Reservation.objects.select_related("user", "node").filter(pk=reservation_id).first()
        if reservation is None:
            continue
        gpus = set(reservation.allocations.filter(active=True).values_list("gpu_id", flat=True))
        alerts = list(due.filter(reservation_id=reservation_id).select_related("gpu"))
        if {a.gpu_id for a in alerts} != gpus:
            continue  # some of its GPUs are in use: the booking stays
        minutes, pct = settings.ALERT_IDLE_MINUTES, settings.ALERT_IDLE_UTILIZATION_PCT
        reason = (
            f"idle: under {pct} % utilisation for {minutes} minutes, and still "
            f"{settings.IDLE_AUTO_RELEASE_MINUTES} minutes after the holder was told (IDLE_AUTO_RELEASE_MINUTES)"
        )
        with transaction.atomic():
            ids = [a.pk for a in alerts]
            if Alert.objects.filter(pk__in=ids, released_at__isnull=True).update(released_at=now) != len(ids):
                transaction.set_rollback(True)  # another run is releasing it
                continue
            try:
                ended = reservation_release(reservation=reservation, actor=PORTAL)
            except BookingError as exc:  # ended or released meanwhile: nothing to take back
                logger.info("idle booking %s not released: %s", reservation_id, exc)
                alerts_resolve(Alert.objects.filter(pk__in=ids), now=now, resolution="the slot ended")
                continue
            audit_record(actor=None, action="reservation.idle_release", target=reservation, reason=reason)
            alerts_resolve(Alert.objects.filter(pk__in=ids), now=now, resolution="booking released automatically")
            # The holder's mail commits with the release (the outbox), or not at all.
            notification_enqueue(
                kind=MailKind.IDLE_RELEASED,
                reservation=ended,
                users=[ended.user],
                moment=ended.end,
                context=_idle_mail_context(alerts, now) | {"reason": reason},
            )
            send_after_commit(reservation_id)
        released.append(reservation_id)
    return released


# --- staff mail -----------------------------------------------------------------------------------


def staff_recipients() -> list[str]:
    staff = get_user_model().objects.filter(is_staff=True, is_active=True).exclude(email="")
    addresses = [*staff.order_by("email").values_list("email", flat=True), *settings.ALERT_EMAILS]
    return list(dict.fromkeys(address.strip() for address in addresses if address.strip()))


@dataclass
class _Mail:
    mail_id: uuid.UUID
    alerts: list[Alert]


def _abandoned(now: datetime) -> Q:
    """Claimed for a mail that never went: its sender died before it could say so."""
    return Q(
        mail_id__isnull=False,
        mailed_at__isnull=True,
        notified_at__lte=now - timedelta(seconds=settings.NOTIFY_CLAIM_SECONDS),
    )


def alerts_mail_staff(*, now: datetime) -> int:
    """Mail staff about every alert not mailed yet, within the hourly rate limit; returns the mails
    sent. Safe to run twice at once: each alert is claimed by a compare-and-swap under a per-kind
    lock, so it goes in one mail only; a mail that fails gives its alerts back for the next run, and
    one whose sender died is sent again once its claim is NOTIFY_CLAIM_SECONDS old."""
    kinds = set(
        Alert.objects.filter(Q(notified_at__isnull=True) | _abandoned(now), kind__in=STAFF_MAIL_KINDS).values_list(
            "kind", flat=True
        )
    )
    recipients = staff_recipients()
    sent = 0
    for kind in sorted(kinds):
        # Each kind's claims carry the moment they were taken, not the run's start: a run that mails
        # slowly through many kinds must not leave claims that already look abandoned to another run.
        claimed_at = timezone.now()
        mails = _claim(kind, claimed_at)
        for position, mail in enumerate(mails):
            try:
                if recipients:
                    send_templated(to=recipients, template="alert_staff", context=_staff_context(mail.alerts, now))
            except Exception:
                unsent = [m.mail_id for m in mails[position:]]
                Alert.objects.filter(mail_id__in=unsent, notified_at=claimed_at).update(notified_at=None, mail_id=None)
                raise
            Alert.objects.filter(mail_id=mail.mail_id, mailed_at__isnull=True).update(mailed_at=timezone.now())
            sent += 1
    return sent


def _claim(kind: str, now: datetime) -> list[_Mail]:
    with transaction.atomic():
        advisory_xact_lock(f"alerts.mail.{kind}")
        # Mails whose sender died after claiming them go again, as they were (their place in the
        # hour's allowance is taken already).
        mails = []
        for mail_id in set(Alert.objects.filter(_abandoned(now), kind=kind).values_list("mail_id", flat=True)):
            if Alert.objects.filter(_abandoned(now), mail_id=mail_id).update(notified_at=now):
                group = Alert.objects.filter(mail_id=mail_id).select_related("node", "gpu").order_by("opened_at", "pk")
                mails.append(_Mail(mail_id, list(group)))  # type: ignore[arg-type]
        used = (
            Alert.objects.filter(kind=kind, notified_at__gt=now - timedelta(hours=1), mail_id__isnull=False)
            .values("mail_id")
            .distinct()
            .count()
        )
        quota = settings.ALERT_MAILS_PER_KIND_PER_HOUR - used
        if quota <= 0:
            return mails
        pending = list(
            Alert.objects.filter(kind=kind, notified_at__isnull=True)
            .select_related("node", "gpu")
            .order_by("opened_at", "pk")
        )
        # Alerts that waited (held back by the limit, or opened while mail was down) go together in
        # one summary; fresh ones one mail each, and past the quota the last mail lists the rest.
        waited = [a for a in pending if a.opened_at < now - MAIL_WAITED]
        fresh = [a for a in pending if a.opened_at >= now - MAIL_WAITED]
        groups = [waited] if waited else []
        quota -= len(groups)
        if quota > 0 and fresh:
            groups += [[a] for a in fresh[: quota - 1]]
            if fresh[quota - 1 :]:
                groups.append(fresh[quota - 1 :])
        for group in groups:
            mail = _Mail(uuid.uuid4(), group)
            claimed = Alert.objects.filter(pk__in=[a.pk for a in group], notified_at__isnull=True).update(
                notified_at=now, mail_id=mail.mail_id
            )
            if claimed == len(group):
                mails.append(mail)
            elif claimed:  # taken by another run meanwhile (not under the lock): send only ours
                mine = set(Alert.objects.filter(mail_id=mail.mail_id).values_list("pk", flat=True))
                mails.append(_Mail(mail.mail_id, [a for a in group if a.pk in mine]))
        return mails


def _staff_context(alerts: list[Alert], now: datetime) -> dict[str, Any]:
    from reservations.timegrid import format_moment

    kind = alerts[0].get_kind_display()
    items = [alert_data(alert) | {"opened_text": format_moment(alert.opened_at)} for alert in alerts]
    return {
        "alerts": items,
        "kind": kind,
        "count": len(alerts),
        "summary": len(alerts) > 1,
        "rate": settings.ALERT_MAILS_PER_KIND_PER_HOUR,
        "now": now,
    }
