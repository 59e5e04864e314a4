"""Celery tasks sending mail: after a booking change, and the beat's scan for due mail."""

from __future__ import annotations

from celery import shared_task

from notifications import services


@shared_task(
    name="notifications.booking_changed",
    ignore_result=True,
    autoretry_for=(OSError,),  # SMTP unreachable: retry; a mail already sent is not sent again
    retry_backoff=30,
    max_retries=8,
)
def booking_changed(reservation_id: int, verb: str) -> int:
    return services.booking_changed(reservation_id, verb)


@shared_task(name="notifications.send_due", ignore_result=True)
def send_due() -> dict[str, int]:
    """Beat, every NOTIFY_SCAN_SECONDS."""
    return services.send_due()
