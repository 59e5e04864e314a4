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

With AVAILABILITY_PACK_NODES, windows that start together are offered on nodes already in use over them first
(packing), so whole nodes stay idle longer (the reports' fully idle node-hours: a node an operator can power
down or cap as a whole, beyond the per-card idle power cap). ``free_at``
answers the other question the suggestions ask (accounting/suggestions.py): at which of these starts is
there room, on which node?
"""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Q

from kernel.fields import LATEST
from nodes.models import Gpu, Node
from reservations.models import MaintenanceWindow
from reservations.reserved import ReservedOccurrence, Restrictions, restrictions_for, room_left, within_room
from reservations.selectors import Place, bookable_units, taken_places
from reservations.timegrid import ceil_to_grid, floor_to_grid, require_in_calendar


@dataclass(frozen=True)
class Window:
    node: Node
    gpus: list[Gpu]
    start: datetime
    end: datetime
    in_use: bool = False  # something else of the node is taken over the window


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

    candidates = _candidates(gpu_count, node_name, min_memory_mib, profile)
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
    windows.sort(key=lambda w: (w.start, not (_packing() and w.in_use), w.node.name))
    return windows[:limit]


def free_at(
    *,
    starts: Iterable[datetime],
    gpu_count: int,
    duration: timedelta,
    now: datetime,
    node_name: str | None = None,
    min_memory_mib: int | None = None,
    profile: str = "",
    user: Any = None,
) -> Iterator[Window]:
    """A window at each of ``starts`` (in the order given) where some node has ``gpu_count`` free units for
    ``duration``: on the first node by name, or with AVAILABILITY_PACK_NODES the first already in use then.
    Starts without room, before the current grid cell or off the calendar give none. Three queries, made
    when the first window is asked for; the caller takes as many as it needs."""
    last = LATEST - duration - timedelta(days=1)  # a slot that would end past the calendar is no answer
    starts = [start for start in map(floor_to_grid, starts) if floor_to_grid(now) <= start < last]
    candidates = _candidates(gpu_count, node_name, min_memory_mib, profile)
    if not starts or not candidates:
        return
    search_from, search_to = min(starts), ceil_to_grid(max(starts) + duration)
    nodes = [gpus[0].node for gpus in candidates.values()]
    kept = restrictions_for(user=user, nodes=nodes, start=search_from, end=search_to, now=now)
    taken = _taken(candidates, search_from, search_to, kept)
    counted = {node_id: [o for o in kept.counted if o.reserved.node_id == node_id] for node_id in candidates}
    for start in starts:
        end = ceil_to_grid(start + duration)
        first = None
        for node_id, gpus in candidates.items():
            window = _fit(gpus, taken[node_id], counted[node_id], gpu_count, start, end)
            if window is not None and (window.in_use or not _packing()):
                first = window
                break
            first = first or window
        if first is not None:
            yield first


def _packing() -> bool:
    return bool(settings.AVAILABILITY_PACK_NODES)


def _candidates(
    gpu_count: int, node_name: str | None, min_memory_mib: int | None, profile: str
) -> dict[int, list[Gpu]]:
    """The bookable units of each active node that has at least ``gpu_count`` of them, by node name."""
    gpu_filter = Q(node__status=Node.Status.ACTIVE)
    if node_name:
        gpu_filter &= Q(node__name=node_name)
    if min_memory_mib is not None:
        gpu_filter &= Q(memory_mib__gte=min_memory_mib)
    units = bookable_units(profile=profile).filter(gpu_filter).select_related("node")
    gpus_by_node: dict[int, list[Gpu]] = defaultdict(list)
    for gpu in units.order_by("node__name", "index", "placement_start"):
        gpus_by_node[gpu.node_id].append(gpu)
    return {node_id: gpus for node_id, gpus in gpus_by_node.items() if len(gpus) >= gpu_count}


class _Places:
    """Places taken on a node's cards, sorted by start per card, so that whether a unit is free over a period
    is found without reading every place of the node: a search asks it for each unit at each candidate start
    (200 starts × every node for the suggestions), and a busy node holds thousands of places over a week."""

    def __init__(self, places: Iterable[Place]) -> None:
        by_card: dict[int, list[Place]] = defaultdict(list)
        for place in places:
            by_card[place.card_id].append(place)
        self._cards = {card: sorted(items, key=lambda place: place.start) for card, items in by_card.items()}
        self._starts = {card: [place.start for place in items] for card, items in self._cards.items()}
        self._longest = {card: max(place.end - place.start for place in items) for card, items in self._cards.items()}

    def overlapping(self, card_id: int, start: datetime, end: datetime) -> Iterator[Place]:
        """The places on the card that overlap [start, end): those starting before ``end``, back to where even
        the card's longest place would have ended by ``start``."""
        items = self._cards.get(card_id)
        if not items:
            return
        reach = start - self._longest[card_id]
        at = bisect_left(self._starts[card_id], end)
        while at > 0:
            at -= 1
            place = items[at]
            if place.start <= reach:
                return
            if place.end > start:
                yield place

    def is_free(self, unit: Gpu, start: datetime, end: datetime) -> bool:
        """Whether no place overlaps ``unit``'s part of its card within [start, end) (selectors.is_free)."""
        low, high = unit.placement
        return not any(place.shares_part(low, high) for place in self.overlapping(unit.card_id, start, end))

    def any_between(self, start: datetime, end: datetime) -> bool:
        return any(next(self.overlapping(card, start, end), None) is not None for card in self._cards)

    def ends(self) -> set[datetime]:
        return {place.end for items in self._cards.values() for place in items}


@dataclass(frozen=True)
class _NodeTaken:
    """What is taken on one node over a search: its bookings and GPU maintenance (``taken``), those and the
    places kept from the person by others' reserved capacity (``blocked``), and whole-node maintenance."""

    taken: _Places
    blocked: _Places
    maintenance: list[tuple[datetime, datetime]]


def _taken(
    candidates: dict[int, list[Gpu]], search_from: datetime, search_to: datetime, kept: Restrictions
) -> dict[int, _NodeTaken]:
    card_node = {gpu.card_id: node_id for node_id, gpus in candidates.items() for gpu in gpus}
    taken: dict[int, list[Place]] = defaultdict(list)
    for place in taken_places(node_ids=candidates.keys(), start=search_from, end=search_to):
        if place.card_id in card_node:
            taken[card_node[place.card_id]].append(place)
    reserved: dict[int, list[Place]] = defaultdict(list)
    for place in map(Place._make, kept.places):
        if place.card_id in card_node:
            reserved[card_node[place.card_id]].append(place)
    maintenance: dict[int, list[tuple[datetime, datetime]]] = defaultdict(list)
    for node_id, start, end in MaintenanceWindow.objects.filter(
        node__in=candidates.keys(), gpu__isnull=True, start__lt=search_to, end__gt=search_from
    ).values_list("node_id", "start", "end"):
        maintenance[node_id].append((start, end))
    return {
        node_id: _NodeTaken(_Places(taken[node_id]), _Places(taken[node_id] + reserved[node_id]), maintenance[node_id])
        for node_id in candidates
    }


_SEARCH_STEPS = (timedelta(days=1), timedelta(days=7))


def _search(
    candidates: dict[int, list[Gpu]],
    gpu_count: int,
    duration: timedelta,
    search_from: datetime,
    search_to: datetime,
    kept: Restrictions,
) -> list[Window]:
    taken = _taken(candidates, search_from, search_to, kept)
    windows = []
    for node_id, gpus in candidates.items():
        node = taken[node_id]
        counted = [o for o in kept.counted if o.reserved.node_id == node_id]
        ends = node.blocked.ends() | {end for _, end in node.maintenance} | {o.end for o in counted}
        for start in sorted({search_from} | {e for e in ends if search_from < e < search_to}):
            end = ceil_to_grid(start + duration)
            if end > search_to:
                continue
            window = _fit(gpus, node, counted, gpu_count, start, end)
            if window is not None:
                windows.append(window)
                break
    return windows


def _fit(
    gpus: list[Gpu],
    node: _NodeTaken,
    counted: list[ReservedOccurrence],
    gpu_count: int,
    start: datetime,
    end: datetime,
) -> Window | None:
    """``gpu_count`` of the node's units free over [start, end), or None. ``in_use``: something of the node
    is taken then (a booking or GPU maintenance)."""
    if any(s < end and e > start for s, e in node.maintenance):
        return None
    free, spare = [], len(gpus) - gpu_count  # units that may be taken before there can be no room
    for gpu in gpus:
        if node.blocked.is_free(gpu, start, end):
            free.append(gpu)
        elif (spare := spare - 1) < 0:
            return None
    if counted and len(free) >= gpu_count:
        free = within_room(free, room_left(node=gpus[0].node, counted=counted, start=start, end=end))
    if len(free) < gpu_count:
        return None
    in_use = node.taken.any_between(start, end)
    return Window(node=gpus[0].node, gpus=free[:gpu_count], start=start, end=end, in_use=in_use)
