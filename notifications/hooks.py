"""What the booking service calls: queue the mails of a change once it has committed."""

from __future__ import annotations

import logging

from django.db import transaction

from notifications.tasks import booking_changed

logger = logging.getLogger(__name__)


def mail_after_commit(reservation_id: int, verb: str) -> None:
    def queue() -> None:
        try:
            booking_changed.delay(reservation_id, verb)
        except Exception:  # the broker is away: the booking stands; the mail is lost, and logged
            logger.exception("mail for reservation #%s (%s) not queued", reservation_id, verb)

    transaction.on_commit(queue)
