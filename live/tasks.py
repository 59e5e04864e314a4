"""Celery tasks of live updates."""

from __future__ import annotations

from celery import shared_task

from live.status import refresh_status, send_node_status

__all__ = ["refresh_live_status", "send_node_status"]  # send_node_status: registered with the worker


# The name it had when it lived in nodes/: it travels in beat's schedule and queued messages.
@shared_task(name="nodes.refresh_status", ignore_result=True)
def refresh_live_status() -> int:
    """Beat, every STATUS_REFRESH_SECONDS: silent nodes turn offline on every status page, and the
    cards of nodes where a slot or maintenance began or ended are sent again."""
    return len(refresh_status())
