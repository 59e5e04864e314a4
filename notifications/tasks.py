"""Celery tasks sending mail from the outbox: nudged after a change commits, and beat's scan."""

from __future__ import annotations

from celery import shared_task

from notifications import services
from reservations.models import Reservation


# The two that send one booking's mails are given back when their pool process is killed under them
# (portal/settings.py): a booking's few mails, which beat's drain would otherwise only send a scan later.
@shared_task(name="notifications.send_outbox", ignore_result=True, reject_on_worker_lost=True)
def send_outbox(reservation_id: int | None = None) -> dict[str, int]:
    """Once a change commits: send the booking's waiting mails now. Whatever this misses (a send that
    failed, a worker that died) stays in the outbox for beat's drain."""
    return services.outbox_drain(reservation_id=reservation_id)


@shared_task(name="notifications.send_due", ignore_result=True)
def send_due() -> dict[str, int]:
    """Beat, every NOTIFY_SCAN_SECONDS: write the mails time made due, then drain the outbox."""
    return services.send_due()


@shared_task(name="notifications.booking_changed", ignore_result=True, reject_on_worker_lost=True)
def booking_changed(reservation_id: int, verb: str) -> dict[str, int]:
    """Messages queued before the outbox existed (an upgrade with a queue not yet empty): write the
    change's mails now and send them. Nothing queues this task any more."""
    reservation = Reservation.objects.select_related("user").filter(pk=reservation_id).first()
    if reservation is not None:
        services.booking_changed(reservation, verb)
    return services.outbox_drain(reservation_id=reservation_id)
