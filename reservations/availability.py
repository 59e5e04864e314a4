"""Finding the earliest windows where N GPUs (or N MIG slices of one profile) of one node are all free
for a duration.

For each node, the candidate starts are the search start and every end of a busy period (a live
allocation or a maintenance window) of that node: a window can only open when something ends.
At each candidate, the units free over the whole window are counted (a unit is taken when anything
overlaps its part of its card: the card itself, a slice of it, or a slice sharing its memory slices);
the first candidate with enough free units is that node's earliest window. The search reaches a day
ahead, then a week, then the whole horizon, only for nodes still without a window: three queries a
step, whatever the number of nodes.

For a person (``user``), reserved capacity of groups they are not in counts as busy (reservations/reserved.py):
a reserved GPU is taken over each unreleased occurrence, and under "any N GPUs of the node" a window offers
at most the node's GPUs minus N minus what other non-members hold; an occurrence's end is a candidate start.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Q

from nodes.models import Gpu, Node
from reservations.models import MaintenanceWindow
from reservations.reserved import ReservedOccurrence, Restrictions, restrictions_for, room_left, within_room
from reservations.selectors import Place, bookable_units, is_free, taken_places
from reservations.timegrid import ceil_to_grid, floor_to_grid, require_in_calendar


@dataclass(frozen=True)
class Window:
    node: Node
    gpus: list[Gpu]
    start: datetime
    end: datetime


def earliest_windows(
    *,
    gpu_count: int,
    duration: timedelta,
    now: datetime,
    after: datetime | None = None,
    node_name: str | None = None,
    min_memory_mib: int | None = None,
    profile: str = "",
    horizon: timedelta = timedelta(days=60),
    limit: int = 10,
    user: Any = None,
) -> list[Window]:
    """The earliest window on each node that has ``gpu_count`` free GPUs (or slices of ``profile``),
    earliest first."""
    if after is not None:
        # The search adds its horizon and the duration to ``after``: near the year 9999 that
        # overflows. The API's field refuses such a time already; this covers every other caller.
        require_in_calendar(after, "after")
    search_from = floor_to_grid(max(after or now, now))
    if search_from < now:  # the current grid cell counts as now
        search_from = now.replace(microsecond=0)

    gpu_filter = Q(node__status=Node.Status.ACTIVE)
    if node_name:
        gpu_filter &= Q(node__name=node_name)
    if min_memory_mib is not None:
        gpu_filter &= Q(memory_mib__gte=min_memory_mib)
    units = bookable_units(profile=profile).filter(gpu_filter).select_related("node")
    gpus_by_node: dict[int, list[Gpu]] = defaultdict(list)
    for gpu in units.order_by("node__name", "index", "placement_start"):
        gpus_by_node[gpu.node_id].append(gpu)
    candidates = {node_id: gpus for node_id, gpus in gpus_by_node.items() if len(gpus) >= gpu_count}
    if not candidates:
        return []

    # Search near dates first: a window found within a short horizon is that node's earliest, and
    # most answers are near, so the far future's bookings are only read for nodes that need them.
    windows: list[Window] = []
    remaining = candidates
    for reach in sorted({min(step, horizon) for step in _SEARCH_STEPS} | {horizon}):
        reach_to = search_from + reach + duration
        kept = restrictions_for(
            user=user, nodes=[gpus[0].node for gpus in remaining.values()], start=search_from, end=reach_to, now=now
        )
        found = _search(remaining, gpu_count, duration, search_from, reach_to, kept)
        windows += found
        done = {window.node.pk for window in found}
        remaining = {node_id: gpus for node_id, gpus in remaining.items() if node_id not in done}
        if not remaining:
            break
    windows.sort(key=lambda w: (w.start, w.node.name))
    return windows[:limit]


_SEARCH_STEPS = (timedelta(days=1), timedelta(days=7))


def _search(
    candidates: dict[int, list[Gpu]],
    gpu_count: int,
    duration: timedelta,
    search_from: datetime,
    search_to: datetime,
    kept: Restrictions,
) -> list[Window]:
    places = taken_places(node_ids=candidates.keys(), start=search_from, end=search_to)
    places += [Place(*place) for place in kept.places]
    node_busy: dict[int, list[tuple[datetime, datetime]]] = defaultdict(list)  # whole-node maintenance
    for node_id, start, end in MaintenanceWindow.objects.filter(
        node__in=candidates.keys(), gpu__isnull=True, start__lt=search_to, end__gt=search_from
    ).values_list("node_id", "start", "end"):
        node_busy[node_id].append((start, end))

    windows = []
    for node_id, gpus in candidates.items():
        cards = {gpu.card_id for gpu in gpus}
        on_node = [place for place in places if place.card_id in cards]
        counted = [o for o in kept.counted if o.reserved.node_id == node_id]
        window = _earliest_on_node(
            gpus, on_node, node_busy[node_id], gpu_count, duration, search_from, search_to, counted
        )
        if window is not None:
            windows.append(window)
    return windows


def _earliest_on_node(
    gpus: list[Gpu],
    places: list[Place],
    node_busy: list[tuple[datetime, datetime]],
    gpu_count: int,
    duration: timedelta,
    search_from: datetime,
    search_to: datetime,
    counted: list[ReservedOccurrence],
) -> Window | None:
    ends = {place.end for place in places} | {end for _, end in node_busy} | {o.end for o in counted}
    for start in sorted({search_from} | {e for e in ends if search_from < e < search_to}):
        end = ceil_to_grid(start + duration)
        if end > search_to or any(s < end and e > start for s, e in node_busy):
            continue
        free = [gpu for gpu in gpus if is_free(gpu, places, start, end)]
        if counted and len(free) >= gpu_count:
            free = within_room(free, room_left(node=gpus[0].node, counted=counted, start=start, end=end))
        if len(free) >= gpu_count:
            return Window(node=gpus[0].node, gpus=free[:gpu_count], start=start, end=end)
    return None
