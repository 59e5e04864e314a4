"""Celery task of environments."""

from __future__ import annotations

from celery import shared_task
from django.utils import timezone

from environments.services import launches_close_overdue


@shared_task(name="environments.close_overdue_launches", ignore_result=True)
def close_overdue_launches() -> int:
    """Beat, every five minutes: idempotent."""
    return launches_close_overdue(now=timezone.now())
