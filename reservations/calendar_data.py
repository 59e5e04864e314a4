"""The calendar's reads: the rows (nodes with their GPUs) and the events (live bookings and
maintenance windows) of one visible range, in the shapes EventCalendar parses.

Like a meeting-room calendar, everyone sees everyone's live bookings with the holder's name; the
purpose stays private to the holder and admins (as in ``ReservationSerializer``).

These build plain dicts straight from ``values_list`` rows rather than returning querysets for a
serializer: a week of a full lab is thousands of bookings, and the answer must not cost a query (or
a serializer) per booking. They serve the calendar page's first paint (``pages.calendar_page``) and
its data endpoint (reservations/calendar_api.py).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.contrib.postgres.fields import RangeBoundary
from django.db import connection
from django.db.models import BooleanField, CharField, ExpressionWrapper, Q, QuerySet
from django.db.models.functions import Cast
from django.urls import reverse

from nodes.models import BOOKABLE_GPUS, Gpu, Node, card_share
from reservations.calendar_format import gpu_label, iso_from_text, iso_utc
from reservations.constraints import TsTzRange
from reservations.models import Allocation, MaintenanceWindow, Reservation
from reservations.permissions import allowed_actions
from reservations.reserved import reserved_overlapping


def calendar_resources(*, node: Node | None = None) -> list[dict[str, Any]]:
    """The rows: one resource per node (all nodes, or ``node``), its GPUs as ``children``, and a MIG card's
    present slices as the card's ``children`` (booking the card books them all). Two queries."""
    nodes = Node.objects.order_by("name")
    gpus = Gpu.objects.filter(Q(parent__isnull=True) | Q(gone_at__isnull=True, parent__mig_mode=True))
    gpus = gpus.order_by("node_id", "index", "parent_id", "placement_start")
    if node is not None:
        nodes, gpus = nodes.filter(pk=node.pk), gpus.filter(node=node)
    children: dict[int, list[dict[str, Any]]] = {}
    slices: dict[int, list[dict[str, Any]]] = {}
    gpus = gpus.annotate(usable=ExpressionWrapper(BOOKABLE_GPUS, output_field=BooleanField()))
    listed = gpus.values_list(
        "pk",
        "node_id",
        "node__name",
        "index",
        "model",
        "memory_mib",
        "usable",
        "parent_id",
        "profile",
        "compute_slices",
        "parent__compute_slices",
    )
    for pk, node_id, node_name, index, model, memory_mib, usable, parent_id, profile, units, card_units in listed:
        label = gpu_label(index, model, memory_mib) if parent_id is None else f"GPU {index} · {profile}"
        row: dict[str, Any] = {
            "id": f"gpu-{pk}",
            "title": label if usable else f"{label} (not bookable)",
            "extendedProps": {
                "kind": "gpu",
                "gpu": pk,
                "node": node_name,
                "index": index,
                "label": label,
                "bookable": usable,
            },
        }
        if parent_id is None:
            children.setdefault(node_id, []).append(row)
        else:
            # Its share of the card, for the node's load row ("2.43/4 booked").
            row["extendedProps"] |= {"slice": profile, "share": round(float(card_share(units, card_units)), 4)}
            slices.setdefault(parent_id, []).append(row)
    for rows in children.values():
        for row in rows:
            if row["extendedProps"]["gpu"] in slices:
                row["children"] = slices[row["extendedProps"]["gpu"]]
    resources = []
    for pk, name, status, whole, manager_state in nodes.values_list(
        "pk", "name", "status", "books_whole", "manager_state"
    ):
        active = status == Node.Status.ACTIVE
        title = name
        if not active:  # why, in the manager's words where it said any (Slurm: "DOWN: not responding")
            title += f" ({Node.Status(status).label.lower()}{f': {manager_state}' if manager_state else ''})"
        title += " (Slurm: booked whole)" if whole else ""
        resources.append(
            {
                "id": f"node-{pk}",
                "title": title,
                "extendedProps": {
                    "kind": "node",
                    "node": name,
                    "status": status,
                    "bookable": active,
                    "whole_node": whole,
                },
                "children": children.get(pk, []),
            }
        )
    return resources


def calendar_events(
    *,
    user: Any,
    start: datetime,
    end: datetime,
    now: datetime,
    resources: list[dict[str, Any]],
    node: Node | None = None,
) -> list[dict[str, Any]]:
    """Live bookings and maintenance windows overlapping [start, end), as EventCalendar events.

    Three queries whatever the number of bookings: the reservations (with their holders), their
    GPUs (the active allocations in the range), the maintenance windows. A booking's allocations
    hold its exact period, so both range filters pick the same bookings; one that changes between
    the two reads is shown as the first read saw it, or not at all, until the next load.
    """
    is_admin = user.is_booking_admin
    # Offers from the waitlist hold their slots too: shown, so that nobody drags over one in vain.
    shown = [*Reservation.LIVE_STATUSES, Reservation.Status.OFFERED]
    reservations = Reservation.objects.filter(status__in=shown, start__lt=end, end__gt=start)
    allocations = _active_allocations_overlapping(start, end)
    if node is not None:
        reservations = reservations.filter(node=node)
        allocations = allocations.filter(reservation__node=node)
    gpus_of: dict[int, list[str]] = {}
    for rid, gpu_id in allocations.order_by("reservation_id", "gpu_id").values_list("reservation_id", "gpu_id"):
        gpus_of.setdefault(rid, []).append(f"gpu-{gpu_id}")
    # The times come as text: Django reads a timestamptz through psycopg's pure-Python loader
    # (~5 µs each), which was the largest cost of a full week (10,000 times). Django runs the
    # connection in UTC, so the text is UTC, and it sorts and compares like the times themselves.
    rows = (
        reservations.order_by("start", "id")
        .annotate(start_text=Cast("start", CharField()), end_text=Cast("end", CharField()))
        .values_list("id", "user_id", "user__username", "start_text", "end_text", "status", "purpose", "extends_id")
    )
    now_key = now.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")
    page_prefix = reservation_page_prefix()
    events = []
    for rid, owner_id, username, start_text, end_text, status, purpose, extends_id in rows:
        resource_ids = gpus_of.get(rid)
        if not resource_ids:
            continue
        mine = owner_id == user.pk
        acts = mine or is_admin
        started, ended = start_text[:19] <= now_key, end_text[:19] <= now_key
        # What the services would allow now (they decide; this only chooses the buttons).
        allowed = allowed_actions(
            owner=mine,
            admin=is_admin,
            status=status,
            is_request=extends_id is not None and status == Reservation.Status.PENDING,
            started=started,
            ended=ended,
        )
        can_extend = "extend" in allowed
        events.append(
            {
                "id": f"reservation-{rid}",
                "resourceIds": resource_ids,
                "start": iso_from_text(start_text),
                "end": iso_from_text(end_text),
                "title": username,
                "classNames": [status, "mine"] if mine else [status],
                # Whether its end may be dragged (which extends it); a booking is never moved.
                "editable": can_extend,
                "extendedProps": {
                    "kind": "reservation",
                    "reservation": rid,
                    "status": status,
                    "mine": mine,
                    "purpose": purpose if acts else None,
                    "can_cancel": "cancel" in allowed,
                    "can_release": "release" in allowed,
                    "extends": extends_id,
                    "can_extend": can_extend,
                    # The booking's page, for those who may open it (its holder and the admins).
                    "url": f"{page_prefix}{rid}/" if acts else None,
                },
            }
        )
    return (
        events
        + _maintenance_events(start=start, end=end, resources=resources, node=node)
        + _reserved_events(user=user, start=start, end=end, now=now, resources=resources, node=node)
    )


def reservation_page_prefix() -> str:
    """'/reservations/' (with any script prefix): a booking's page is this plus '<id>/'. Reversed
    once per answer rather than once per booking, which a full week of a lab would feel."""
    sample = reverse("reservation-detail", kwargs={"pk": 1})
    if not sample.endswith("/1/"):
        raise ValueError(f"The booking page's URL changed shape: {sample}")
    return sample.removesuffix("1/")


def _active_allocations_overlapping(start: datetime, end: datetime) -> QuerySet[Allocation]:
    allocations = Allocation.objects.filter(active=True)
    if connection.vendor != "postgresql":
        return allocations.filter(start__lt=end, end__gt=start)
    # Written as the exclusion constraint's expression, so that its GiST index finds the range's
    # allocations directly, however long the history (a plain start/end filter scans it all).
    period = TsTzRange("start", "end", RangeBoundary())
    return allocations.annotate(period=period).filter(period__overlap=(start, end))


def _maintenance_events(
    *, start: datetime, end: datetime, resources: list[dict[str, Any]], node: Node | None
) -> list[dict[str, Any]]:
    """Maintenance windows as background events: on the node's row and all its GPUs, or on one GPU."""
    rows_of_node = {
        row["extendedProps"]["node"]: [row["id"], *(child["id"] for child in row["children"])] for row in resources
    }
    windows = MaintenanceWindow.objects.filter(start__lt=end, end__gt=start)
    if node is not None:
        windows = windows.filter(node=node)
    events = []
    for pk, node_name, gpu_id, w_start, w_end, reason in windows.order_by("start", "pk").values_list(
        "pk", "node__name", "gpu_id", "start", "end", "reason"
    ):
        events.append(
            {
                "id": f"maintenance-{pk}",
                "resourceIds": [f"gpu-{gpu_id}"] if gpu_id else rows_of_node.get(node_name, []),
                "start": iso_utc(w_start),
                "end": iso_utc(w_end),
                "title": f"Maintenance: {reason}" if reason else "Maintenance",
                "display": "background",
                "classNames": ["maintenance"],
                "extendedProps": {"kind": "maintenance", "maintenance": pk, "node": node_name, "gpu": gpu_id},
            }
        )
    return events


def _reserved_events(
    *, user: Any, start: datetime, end: datetime, now: datetime, resources: list[dict[str, Any]], node: Node | None
) -> list[dict[str, Any]]:
    """Reserved capacity's unreleased occurrences as background events, a shaded band labelled with the group:
    on the reserved GPUs' rows (a card's slices too), or for "any N GPUs" on the node's row (which GPUs is not
    decided: the band says how many).
    A released occurrence is not shown: anyone may book it. ``member`` says whether the viewer may book
    inside (a member of the group, or a booking admin): the calendar still lets everyone drag over it, and
    the booking service refuses the others with the group named."""
    row_of_node = {row["extendedProps"]["node"]: row["id"] for row in resources}
    rows_of_gpu: dict[int, list[str]] = {}
    for row in resources:
        for card in row["children"]:
            rows_of_gpu[card["extendedProps"]["gpu"]] = [
                card["id"],
                *(child["id"] for child in card.get("children", [])),
            ]
            for child in card.get("children", []):
                rows_of_gpu[child["extendedProps"]["gpu"]] = [child["id"]]
    occurrences = reserved_overlapping(start=start, end=end, now=now, nodes=[node] if node else None)
    if not occurrences:
        return []
    groups = set(user.groups.values_list("pk", flat=True)) if getattr(user, "pk", None) else set()
    nodes_of_model: dict[str, set[str]] = {}
    anywhere = {o.reserved.gpu_model for o in occurrences if o.reserved.node_id is None}
    if anywhere:  # counts of a model on any node: which nodes have it (one more query, only then)
        for model, name in Gpu.objects.filter(model__in=anywhere).values_list("model", "node__name").distinct():
            nodes_of_model.setdefault(model, set()).add(name)
    events = []
    for occurrence in occurrences:
        reserved = occurrence.reserved
        group = reserved.group.name
        gpu_ids = sorted(gpu.pk for gpu in reserved.gpus.all())
        if reserved.count:
            of_model = f" of model {reserved.gpu_model}" if reserved.gpu_model else ""
            title = f"{reserved.count} GPU{'s' if reserved.count != 1 else ''}{of_model} reserved for {group}"
            # A count of a model on any node: the band is on every node row that has the model.
            names = [reserved.node.name] if reserved.node else sorted(nodes_of_model.get(reserved.gpu_model, ()))
            row_ids = [row_of_node[name] for name in names if name in row_of_node]
        else:
            title = f"reserved: {group}"
            row_ids = [row for gpu_id in gpu_ids for row in rows_of_gpu.get(gpu_id, [f"gpu-{gpu_id}"])]
        if reserved.label:
            title += f" ({reserved.label})"
        events.append(
            {
                "id": f"reserved-{reserved.pk}-{int(occurrence.start.timestamp())}",
                "resourceIds": list(dict.fromkeys(row_ids)),
                "start": iso_utc(occurrence.start),
                "end": iso_utc(occurrence.end),
                "title": title,
                "display": "background",
                "classNames": ["reserved"],
                "extendedProps": {
                    "kind": "reserved",
                    "reserved": reserved.pk,
                    "group": group,
                    "node": reserved.node.name if reserved.node else None,
                    "model": reserved.gpu_model or None,
                    "gpus": gpu_ids,
                    "count": reserved.count,
                    "member": reserved.group_id in groups or bool(user.is_booking_admin),
                    "release_at": iso_utc(occurrence.release_at) if occurrence.release_at else None,
                },
            }
        )
    return events
