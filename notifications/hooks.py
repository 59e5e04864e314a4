"""What runs inside a change's transaction (notifications/receivers.py for bookings, alerts for their
mails): write the change's mails to the outbox, and nudge a worker to send them once the change commits.

The rows are written in the change's own transaction (so the caller must call this inside it): a
rolled-back change leaves no mail, and a committed one always has its mail, whether or not the broker
was there for the nudge. A lost nudge only delays the mail until beat's next drain
(notifications.services.send_due, every NOTIFY_SCAN_SECONDS).
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.db import transaction

from notifications.services import booking_changed
from notifications.tasks import send_outbox
from reservations.models import Reservation

logger = logging.getLogger(__name__)


def mail_after_commit(reservation: Reservation, verb: str) -> None:
    """The mails of a booking change (``verb``: create, approve, reject, cancel, release, extend...), decided
    from the booking as the change left it."""
    if booking_changed(reservation, verb):
        send_after_commit(reservation.pk)


def send_after_commit(reservation_id: int) -> None:
    """Once the current transaction commits, ask a worker to send the booking's waiting mails."""
    transaction.on_commit(lambda: _nudge(reservation_id))


def _nudge(reservation_id: int) -> None:
    try:
        # One try, no reconnecting: the change has committed and its caller (a web request) waits;
        # kombu's pooled producer would retry for about 6 s with the broker down. The drain is the
        # retry. A connection of its own costs a TCP connect per change that mails.
        with send_outbox.app.connection_for_write(connect_timeout=2, transport_options={"max_retries": 0}) as broker:
            send_outbox.apply_async(  # type: ignore[call-arg]  # celery-types lack the `connection` option
                kwargs={"reservation_id": reservation_id},
                connection=broker,
                retry=False,
                expires=settings.NOTIFY_CLAIM_SECONDS,
            )
    except Exception:  # the broker is away: the rows wait in the outbox for beat's drain
        logger.warning("mail for reservation #%s not queued; beat's drain will send it", reservation_id, exc_info=True)
