"""Celery tasks of the portal for nodes: pruning what agents reported, keeping the nodes' broker users."""

from __future__ import annotations

from celery import shared_task
from django.utils import timezone

from nodes.broker_users import broker_users_sync
from nodes.ingest import node_events_prune
from nodes.usage import usage_prune


@shared_task(name="nodes.prune_usage", ignore_result=True)
def prune_usage() -> int:
    """Beat, hourly: per-minute telemetry older than TELEMETRY_MINUTES_KEEP_DAYS goes."""
    return usage_prune(timezone.now())


@shared_task(name="nodes.prune_events", ignore_result=True)
def prune_events() -> int:
    """Beat, hourly: agent events received more than NODE_EVENTS_KEEP_DAYS ago go, in batches."""
    return node_events_prune(timezone.now())


@shared_task(name="nodes.sync_broker_users", ignore_result=True)
def sync_broker_users() -> int:
    """Beat, every minute: the nodes' broker users that Redis lost (a restart without an ACL file) are made
    again from their stored hashes, so an agent is back on its queue within a minute. A broker that refuses
    raises: the job stays late, and the jobs-late alert says so."""
    return len(broker_users_sync().repaired)
