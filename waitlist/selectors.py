"""Reading the waitlist: entries in the order freed capacity reaches them."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from django.db.models import Count, QuerySet

from fairshare.factors import fairshare_for
from waitlist.models import Entry


def ranked(entries: Iterable[Entry], *, now: datetime) -> list[Entry]:
    """Best first: the highest fair-share factor, then the earliest to arrive (docs/booking-rules.md)."""
    found = list(entries)
    if not found:
        return []
    factors = fairshare_for({entry.user_id for entry in found}, now=now)
    return sorted(found, key=lambda entry: (*factors[entry.user_id].order_key(entry.created_at), entry.pk))


def waiting(queryset: QuerySet[Entry] | None = None) -> QuerySet[Entry]:
    qs = queryset if queryset is not None else Entry.objects.all()
    return (
        qs.filter(status__in=Entry.OPEN_STATUSES)
        .select_related("user", "node", "reservation")
        .prefetch_related("gpus__parent", "gpus__node")
    )


def queue_by_node(*, now: datetime) -> dict[str, list[Entry]]:
    """Every open entry, grouped by node name ("any node" for an any-of-a-model entry), each group in the order
    it would be served; each entry gets ``position`` (1 is next)."""
    groups: dict[str, list[Entry]] = {}
    for entry in waiting():
        groups.setdefault(entry.node.name if entry.node else "any node", []).append(entry)
    for name, entries in groups.items():
        groups[name] = ranked(entries, now=now)
        for position, entry in enumerate(groups[name], start=1):
            entry.position = position  # type: ignore[attr-defined]
    return dict(sorted(groups.items()))


def with_positions(entries: list[Entry], *, now: datetime) -> list[Entry]:
    """``entries`` (anyone's), each open one with its ``position`` in its node's queue; None for closed ones."""
    queues = queue_by_node(now=now) if any(entry.is_open for entry in entries) else {}
    positions = {entry.pk: entry.position for queue in queues.values() for entry in queue}  # type: ignore[attr-defined]
    for entry in entries:
        entry.position = positions.get(entry.pk)  # type: ignore[attr-defined]
    return entries


def waitlist_counts() -> dict[str, int]:
    """Open entries by state (waiting, offered), zeros included: for /metrics."""
    counts = dict.fromkeys(Entry.OPEN_STATUSES, 0)
    for status, count in (
        Entry.objects.filter(status__in=Entry.OPEN_STATUSES).values_list("status").annotate(count=Count("pk"))
    ):
        counts[status] = count
    return {str(status): count for status, count in counts.items()}
