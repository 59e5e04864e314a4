"""What notifications does when a booking changes: its mails go to the outbox in the change's own
transaction, and a worker is nudged to send them once it commits (notifications/hooks.py)."""

from __future__ import annotations

from typing import Any

from django.dispatch import receiver

from notifications.hooks import mail_after_commit
from reservations.models import Reservation
from reservations.signals import reservation_changed


@receiver(reservation_changed.in_transaction)
def queue_booking_mails(sender: type, reservation: Reservation, mail_verb: str, **kwargs: Any) -> None:
    mail_after_commit(reservation, mail_verb)
