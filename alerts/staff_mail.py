"""Mail to staff about alerts: every alert is mailed at least once, and a flood becomes summaries.

``alerts_mail_staff`` runs after an alert opens (``staff_mail_soon``) and on every beat. Each alert
is claimed by a compare-and-swap on ``notified_at`` and confirmed by ``mailed_at``; a claim left by
a sender that died is taken again after NOTIFY_CLAIM_SECONDS. At most ALERT_MAILS_PER_KIND_PER_HOUR
mails go per kind per hour; past that, alerts wait and go together in one summary once the hour
allows. Idle GPUs are not mailed to staff: their holders hear of them (alerts/idle.py).
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from celery import shared_task
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from alerts.models import Alert
from alerts.selectors import alert_data
from kernel.locks import advisory_xact_lock
from notifications.mail import send_templated
from reservations.timegrid import format_moment

logger = logging.getLogger(__name__)

Kind = Alert.Kind
# Idle GPUs are the holder's business: they are shown to admins, never mailed to them.
STAFF_MAIL_KINDS = tuple(kind for kind in Kind if kind != Kind.IDLE)
# An alert not mailed this long after it opened waited (rate limit, mail or worker down): it goes
# in a summary with the others that waited, not in a mail of its own.
MAIL_WAITED = timedelta(minutes=2)


def staff_mail_soon(*, alert_ids: list[int]) -> None:
    """After commit: ask a worker to mail staff now rather than at beat's next run."""

    def queue() -> None:
        try:
            mail_staff.apply_async(expires=300)
        except Exception:  # broker away: beat's next run sends it
            logger.exception("staff mail for alerts %s not queued; beat will send it", alert_ids)

    transaction.on_commit(queue)


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
            # Never None (_abandoned asks for a mail_id): the test is for the nullable column's type.
            if mail_id is not None and Alert.objects.filter(_abandoned(now), mail_id=mail_id).update(notified_at=now):
                again = Alert.objects.filter(mail_id=mail_id).select_related("node", "gpu").order_by("opened_at", "pk")
                mails.append(_Mail(mail_id, list(again)))
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


@shared_task(name="alerts.mail_staff", ignore_result=True)
def mail_staff() -> int:
    """After an alert opens, and beat every minute: staff mail for alerts not mailed yet (each once,
    within ALERT_MAILS_PER_KIND_PER_HOUR). A failed send gives its alerts back for the next run."""
    return alerts_mail_staff(now=timezone.now())
