"""Celery task of the waitlist."""

from __future__ import annotations

from celery import shared_task

from waitlist.services import waitlist_sweep


@shared_task(name="waitlist.sweep", ignore_result=True)
def sweep() -> dict[str, int]:
    """Beat, every minute: idempotent."""
    done = waitlist_sweep()
    return {
        "lapsed": len(done.lapsed),
        "expired": len(done.expired),
        "settled": len(done.settled),
        "passed_on": len(done.passed_on),
    }
