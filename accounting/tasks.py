"""Celery task of the accounting: rolling minutes up into hours."""

from __future__ import annotations

from celery import shared_task

from accounting.rollup import rollup_recent


@shared_task(name="accounting.rollup_usage", ignore_result=True)
def rollup_usage() -> int:
    """Beat, every USAGE_ROLLUP_SECONDS: idempotent, and it catches up from the last hour written."""
    return rollup_recent()
