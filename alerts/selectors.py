"""Reading alerts: the open ones (status page, admin) and an alert as pages and mails show it."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db.models import QuerySet
from django.urls import reverse

from alerts.models import Alert
from nodes.mig import CardLayout


def open_alerts() -> QuerySet[Alert]:
    return Alert.objects.filter(resolved_at__isnull=True).select_related("node", "gpu").order_by("-opened_at", "-pk")


def open_alerts_data(limit: int = 200) -> list[dict[str, Any]]:
    """The newest ``limit`` open alerts as the status page and its "alerts" topic show them."""
    return [alert_data(alert) for alert in open_alerts()[:limit]]


def alerts_data(*, alert_ids: Sequence[int]) -> list[dict[str, Any]]:
    """These alerts as the status page's "alerts" topic shows them (what changed, as committed)."""
    alerts = Alert.objects.filter(pk__in=alert_ids).select_related("node", "gpu")
    return [alert_data(alert) for alert in alerts]


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment is not None else None


DEFAULT_SUMMARIES: dict[str, str] = {
    Alert.Kind.VIOLATION: "processes on a GPU its user has no booking for",
    Alert.Kind.LEFTOVER: "processes still running after the slot ended",
    Alert.Kind.UNKILLABLE: "processes could not be ended: the GPU is drained",
}


def alert_summary(alert: Alert) -> str:
    """What is wrong, in a few words, from the readings or events behind it."""
    details = alert.details or {}
    readings = details.get("readings") or []
    last = readings[-1] if readings else {}
    event = details.get("event") or {}
    if alert.kind == Alert.Kind.TEMPERATURE and last:
        limit = details.get("limit_c")
        slowdown = last.get("slowdown_temperature_c")
        text = f"{last.get('temperature_c')} °C (alert at {limit} °C"
        return text + (f", slowdown at {slowdown} °C)" if slowdown is not None else ")")
    if alert.kind == Alert.Kind.ECC and last:
        return f"{last.get('ecc_errors_uncorrected')} uncorrected ECC errors"
    if alert.kind == Alert.Kind.OFFLINE:
        return "its agent stopped reporting"
    if alert.kind == Alert.Kind.SLURM_UNREACHABLE:
        waited = f" for {_duration(details['seconds'])}" if details.get("seconds") is not None else ""
        return f"no answer{waited}: {details.get('problem') or 'unknown'}; bookings wait for the reconcile to catch up"
    if alert.kind == Alert.Kind.SLURM_REFUSED:
        return f"booking #{details.get('reservation')} has no reservation in Slurm: {details.get('problem')}"
    if alert.kind == Alert.Kind.MIG_LAYOUT_CHANGED and details.get("reported"):
        confirmed, reported = CardLayout(**details["confirmed"]), CardLayout(**details["reported"])
        return (
            f"confirmed: {confirmed}; its agent reports {reported}. Card and slices take no bookings until an admin "
            "confirms (GPUs → Confirm the MIG layout)"
        )
    if alert.kind == Alert.Kind.JOBS_LATE:
        return "; ".join(_job_late(job) for job in details.get("jobs") or []) or "periodic jobs stopped running"
    if alert.kind == Alert.Kind.IDLE:
        return (
            f"under {details.get('limit_pct')} % for {details.get('minutes')} minutes "
            f"(mean {details.get('mean_utilization_pct')} %), booking #{details.get('reservation')}"
        )
    pids = event.get("pids") or ([event["pid"]] if event.get("pid") else [])
    text = event.get("message") or DEFAULT_SUMMARIES.get(alert.kind, "")
    if pids:
        text = f"{text} (pids {', '.join(map(str, pids))})".strip()
    return text


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.0f} h"
    return f"{seconds / 86400:.0f} days"


def _job_late(job: dict[str, Any]) -> str:
    """One late job as the summary names it: "send-due-mail (every 1 min): no success for 12 min"."""
    waited = _duration(job.get("waited_seconds") or 0)
    since = "no success for" if job.get("last_success_at") else "never succeeded in"
    return f"{job.get('name')} (every {_duration(job.get('period_seconds') or 0)}): {since} {waited}"


def alert_data(alert: Alert) -> dict[str, Any]:
    """An alert as the admins' status page and the staff mail show it. ``node`` is None for an alert
    about the portal itself (periodic jobs late)."""
    return {
        "id": alert.pk,
        "kind": alert.kind,
        "label": alert.get_kind_display(),
        "node": alert.node.name if alert.node else None,
        "gpu": alert.gpu.index if alert.gpu else None,
        "user": alert.username,
        "open": alert.resolved_at is None,
        "opened_at": _iso(alert.opened_at),
        "last_bad_at": _iso(alert.last_bad_at),
        "resolved_at": _iso(alert.resolved_at),
        "resolution": alert.resolution,
        "mailed": alert.mailed_at is not None,
        "summary": alert_summary(alert),
        "admin_url": reverse("admin:alerts_alert_change", args=[alert.pk]),
    }
