"""The booking calendar page and the data it loads per visible range.

The page (``/``) is a resource timeline drawn by EventCalendar (vendored under static/vendor/): GPUs
as rows grouped by node, time across. Its data comes from ``GET /api/v1/calendar/?start=&end=``,
which answers everything one visible range needs in one response: the rows (nodes with their GPUs)
and the events (live bookings and maintenance windows overlapping the range), in the shapes
EventCalendar parses. Booking, cancelling, releasing and extending go through the reservations API
like every other client; this module only reads.

Like a meeting-room calendar, everyone sees everyone's live bookings with the holder's name; the
purpose stays private to the holder and admins (as in ``ReservationSerializer``).

The reads live here rather than in selectors.py because they exist only for this view and build
plain dicts straight from ``values_list`` rows: a week of a full lab is thousands of bookings, and
the answer must not cost a query (or a serializer) per booking.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.contrib.postgres.fields import RangeBoundary
from django.db import connection
from django.db.models import BooleanField, CharField, ExpressionWrapper, QuerySet
from django.db.models.functions import Cast
from django.http import HttpRequest, HttpResponse
from django.middleware.csrf import get_token
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone
from django.utils.decorators import method_decorator
from django.views.decorators.gzip import gzip_page
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from kernel.api_schema import READ_ERRORS
from kernel.fields import AwareDateTimeField
from nodes.models import BOOKABLE_GPUS, Gpu, Node, mib_to_gb
from reservations.constraints import TsTzRange
from reservations.models import Allocation, MaintenanceWindow, Reservation
from reservations.permissions import allowed_actions

# The longest range one request may ask for: two months, which is more than any view shows.
MAX_RANGE = timedelta(days=62)

# "NVIDIA A100-SXM4-80GB" -> "A100-SXM4": the memory is shown on its own, from memory_mib.
_VENDOR_PREFIX = re.compile(r"^NVIDIA\s+", re.IGNORECASE)
_MEMORY_SUFFIX = re.compile(r"[-\s]*\d+\s*GB\b.*$", re.IGNORECASE)
# A "+01:00" offset sent unencoded in a query string arrives as " 01:00".
_SPACED_OFFSET = re.compile(r" (\d{2}:\d{2})$")


# --- the page -------------------------------------------------------------------------------


@login_required
def calendar_page(request: HttpRequest) -> HttpResponse:
    user: Any = request.user
    zone_name = user.zone.key
    config = {
        "urls": {
            "calendar": reverse("api:calendar"),
            "reservations": reverse("api:reservation-list"),
        },
        "csrf_token": get_token(request),
        "user": user.get_username(),
        "is_admin": user.is_booking_admin,
        "grid_minutes": settings.BOOKING_GRID_MINUTES,
        # EventCalendar takes a fixed offset, not a zone name: the calendar shows the offset the
        # user's zone has now, so a week that crosses a DST change is drawn with one offset (times
        # after the change read one hour off). The zone's name is shown on the page.
        "time_zone": {"name": zone_name, "offset": utc_offset(zone_name, timezone.now())},
        "purpose_max_length": settings.BOOKING_PURPOSE_MAX_LENGTH,
        # The rows for the first paint; every data response carries them again.
        "resources": calendar_resources(),
    }
    return render(
        request,
        "reservations/calendar.html",
        {"nav": "calendar", "config": config, "zone_name": zone_name, "zone_offset": config["time_zone"]["offset"]},
    )


def utc_offset(zone_name: str, moment: datetime) -> str:
    """The offset of ``zone_name`` at ``moment`` as EventCalendar wants it: '+01:00', '-05:30'."""
    offset = moment.astimezone(ZoneInfo(zone_name)).utcoffset() or timedelta(0)
    minutes = round(offset.total_seconds() / 60)
    sign = "-" if minutes < 0 else "+"
    hours, minutes = divmod(abs(minutes), 60)
    return f"{sign}{hours:02d}:{minutes:02d}"


# --- the data -------------------------------------------------------------------------------


def _iso(moment: datetime) -> str:
    # Always "+00:00", never "Z": EventCalendar reads an offset only in the ±HH:MM form and would
    # take a "Z" time as wall-clock time in the calendar's zone.
    return moment.astimezone(UTC).isoformat()


def gpu_label(index: int, model: str, memory_mib: int) -> str:
    """'GPU 0 · A100-SXM4 80 GB'."""
    short = _MEMORY_SUFFIX.sub("", _VENDOR_PREFIX.sub("", model.strip())) or model.strip()
    return f"GPU {index} · {short} {mib_to_gb(memory_mib)} GB"


def calendar_resources(*, node: Node | None = None) -> list[dict[str, Any]]:
    """The rows: one resource per node (all nodes, or ``node``), its GPUs as ``children``. Two queries."""
    nodes = Node.objects.order_by("name")
    gpus = Gpu.objects.filter(parent__isnull=True).order_by("node_id", "index")
    if node is not None:
        nodes, gpus = nodes.filter(pk=node.pk), gpus.filter(node=node)
    children: dict[int, list[dict[str, Any]]] = {}
    gpus = gpus.annotate(usable=ExpressionWrapper(BOOKABLE_GPUS, output_field=BooleanField()))
    for pk, node_id, node_name, index, model, memory_mib, usable in gpus.values_list(
        "pk", "node_id", "node__name", "index", "model", "memory_mib", "usable"
    ):
        label = gpu_label(index, model, memory_mib)
        children.setdefault(node_id, []).append(
            {
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
        )
    resources = []
    for pk, name, status in nodes.values_list("pk", "name", "status"):
        active = status == Node.Status.ACTIVE
        title = name if active else f"{name} ({Node.Status(status).label.lower()})"
        resources.append(
            {
                "id": f"node-{pk}",
                "title": title,
                "extendedProps": {"kind": "node", "node": name, "status": status, "bookable": active},
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
    reservations = Reservation.objects.filter(status__in=Reservation.LIVE_STATUSES, start__lt=end, end__gt=start)
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
                "start": _iso_from_text(start_text),
                "end": _iso_from_text(end_text),
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
    return events + _maintenance_events(start=start, end=end, resources=resources, node=node)


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


def _iso_from_text(text: str) -> str:
    """'2030-01-07 10:00:00+00' (PostgreSQL in UTC) or '2030-01-07 10:00:00' (SQLite, UTC) -> ISO 8601."""
    if len(text) == 19 or (len(text) == 22 and text.endswith("+00")):
        return f"{text[:10]}T{text[11:19]}+00:00"
    moment = datetime.fromisoformat(text)
    return _iso(moment if moment.tzinfo else moment.replace(tzinfo=UTC))


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
                "start": _iso(w_start),
                "end": _iso(w_end),
                "title": f"Maintenance: {reason}" if reason else "Maintenance",
                "display": "background",
                "classNames": ["maintenance"],
                "extendedProps": {"kind": "maintenance", "maintenance": pk, "node": node_name, "gpu": gpu_id},
            }
        )
    return events


# --- the endpoint ---------------------------------------------------------------------------


class CalendarQuery(serializers.Serializer):
    start = AwareDateTimeField(help_text="Start of the visible range, ISO 8601 with an offset.")
    end = AwareDateTimeField(help_text=f"End of the range (exclusive); at most {MAX_RANGE.days} days after start.")
    node = serializers.CharField(required=False, max_length=63, help_text="Only this node's rows and events.")

    def to_internal_value(self, data: Any) -> Any:
        # A '+' left unencoded in a query string reads as a space: take "…T09:00:00 01:00" as "+01:00".
        fixed = {key: data.get(key) for key in ("start", "end", "node") if data.get(key) is not None}
        for key in ("start", "end"):
            if isinstance(fixed.get(key), str):
                fixed[key] = _SPACED_OFFSET.sub(r"+\1", fixed[key])
        return super().to_internal_value(fixed)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs["end"] <= attrs["start"]:
            raise serializers.ValidationError({"end": "The end must be after the start."})
        if attrs["end"] - attrs["start"] > MAX_RANGE:
            days = (attrs["end"] - attrs["start"]) / timedelta(days=1)
            raise serializers.ValidationError(
                {"end": f"The range is {days:g} days long; ask for at most {MAX_RANGE.days} days at a time."}
            )
        if "node" in attrs:
            node = Node.objects.filter(name=attrs["node"]).first()
            if node is None:
                raise serializers.ValidationError({"node": f"No node named {attrs['node']!r}."})
            attrs["node"] = node
        return attrs


# Output shapes, for the schema (the view builds the same dicts directly, for speed).
class GpuResourceProps(serializers.Serializer):
    kind = serializers.ChoiceField(choices=["gpu"])
    gpu = serializers.IntegerField(help_text="The GPU's id, as the reservations API takes it.")
    node = serializers.CharField()
    index = serializers.IntegerField()
    label = serializers.CharField()
    bookable = serializers.BooleanField()


class GpuResource(serializers.Serializer):
    id = serializers.CharField(help_text="gpu-<id>")
    title = serializers.CharField(help_text="Like 'GPU 0 · A100-SXM4 80 GB'.")
    extendedProps = GpuResourceProps()  # EventCalendar's field names


class NodeResourceProps(serializers.Serializer):
    kind = serializers.ChoiceField(choices=["node"])
    node = serializers.CharField()
    status = serializers.ChoiceField(choices=Node.Status.values)
    bookable = serializers.BooleanField()


class NodeResource(serializers.Serializer):
    id = serializers.CharField(help_text="node-<id>")
    title = serializers.CharField()
    extendedProps = NodeResourceProps()
    children = GpuResource(many=True)


class CalendarEventProps(serializers.Serializer):
    kind = serializers.ChoiceField(choices=["reservation", "maintenance"])
    reservation = serializers.IntegerField(required=False, help_text="Bookings: the reservation's id.")
    status = serializers.ChoiceField(choices=list(Reservation.LIVE_STATUSES), required=False)
    mine = serializers.BooleanField(required=False)
    purpose = serializers.CharField(
        required=False, allow_null=True, help_text="Null unless the booking is yours (admins: everyone's)."
    )
    can_cancel = serializers.BooleanField(required=False)
    can_release = serializers.BooleanField(required=False)
    can_extend = serializers.BooleanField(required=False)
    url = serializers.CharField(
        required=False,
        allow_null=True,
        help_text="Bookings: the path of the booking's page; null unless it is yours (admins: everyone's).",
    )
    extends = serializers.IntegerField(
        required=False, allow_null=True, help_text="A pending extension: the booking it would lengthen."
    )
    maintenance = serializers.IntegerField(required=False, help_text="Maintenance windows: the window's id.")
    node = serializers.CharField(required=False, help_text="Maintenance windows: the node.")
    gpu = serializers.IntegerField(
        required=False, allow_null=True, help_text="Maintenance windows: the GPU, or null for the whole node."
    )


class CalendarEvent(serializers.Serializer):
    id = serializers.CharField(help_text="reservation-<id> or maintenance-<id>")
    resourceIds = serializers.ListField(
        child=serializers.CharField(), help_text="gpu-<id> of each GPU (and node-<id>)."
    )
    start = serializers.CharField(help_text="ISO 8601, always with a +00:00 offset.")
    end = serializers.CharField()
    title = serializers.CharField(help_text="The holder's username, or 'Maintenance: <reason>'.")
    classNames = serializers.ListField(
        child=serializers.CharField(), help_text="Bookings: the status ('pending', 'approved'), and 'mine' for yours."
    )
    display = serializers.ChoiceField(choices=["background"], required=False)
    editable = serializers.BooleanField(
        required=False, help_text="Bookings: whether you may extend it now (drag its end); nothing can be moved."
    )
    extendedProps = CalendarEventProps()


class CalendarSerializer(serializers.Serializer):
    resources = NodeResource(many=True)
    events = CalendarEvent(many=True)
    now = serializers.DateTimeField()


# A full week is ~2 MB of JSON and ~90 KB gzipped, so the answer is compressed for clients that
# accept it (browsers do). It holds no secret an attacker could probe by reflecting input (BREACH):
# no CSRF token, and a cross-site request carries no session cookie (SameSite=Lax).
@method_decorator(gzip_page, name="dispatch")
class CalendarDataView(APIView):
    @extend_schema(
        summary="The booking calendar for a range: nodes with their GPUs, live bookings, maintenance",
        description=(
            "Everything the calendar page draws for one visible range, in EventCalendar's shapes. "
            "Everyone's live (pending or approved) bookings that overlap the range, one event per "
            "booking on all its GPUs, titled with the holder's name; the purpose only for your own "
            "(admins: all). Maintenance windows come as background events. "
            f"The range may be at most {MAX_RANGE.days} days long."
        ),
        parameters=[CalendarQuery],
        responses={200: CalendarSerializer, **READ_ERRORS},
    )
    def get(self, request: Request) -> Response:
        query = CalendarQuery(data=request.query_params)
        query.is_valid(raise_exception=True)
        data = query.validated_data
        now = timezone.now()
        node = data.get("node")
        resources = calendar_resources(node=node)
        events = calendar_events(
            user=request.user, start=data["start"], end=data["end"], now=now, resources=resources, node=node
        )
        return Response({"resources": resources, "events": events, "now": _iso(now)})
