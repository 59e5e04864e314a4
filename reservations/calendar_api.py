"""The calendar's data endpoint, ``GET /api/v1/calendar/?start=&end=``: everything one visible range
of the calendar page needs in one response, the rows (nodes with their GPUs) and the events (live
bookings and maintenance windows overlapping the range), in the shapes EventCalendar parses.

Booking, cancelling, releasing and extending go through the reservations API like every other
client; this endpoint only reads (reservations/calendar_data.py).
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

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
from nodes.models import Node
from reservations.calendar_data import calendar_events, calendar_resources
from reservations.calendar_format import iso_utc
from reservations.models import Reservation

# The longest range one request may ask for: two months, which is more than any view shows.
MAX_RANGE = timedelta(days=62)

# A "+01:00" offset sent unencoded in a query string arrives as " 01:00".
_SPACED_OFFSET = re.compile(r" (\d{2}:\d{2})$")


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
    label = serializers.CharField()  # type: ignore[assignment]  # a field named "label"; the stubs see Field.label
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
    kind = serializers.ChoiceField(choices=["reservation", "maintenance", "reserved"])
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
    group = serializers.CharField(required=False, help_text="Reserved capacity: the group it is kept for.")
    gpus = serializers.ListField(
        child=serializers.IntegerField(), required=False, help_text="Reserved capacity: the reserved GPUs' ids."
    )
    count = serializers.IntegerField(
        required=False, allow_null=True, help_text='Reserved capacity: N of "any N GPUs of the node", else null.'
    )
    member = serializers.BooleanField(
        required=False, help_text="Reserved capacity: whether you may book inside it (a member, or an admin)."
    )
    release_at = serializers.CharField(
        required=False, allow_null=True, help_text="Reserved capacity: when it opens to everyone (null: never)."
    )


class CalendarEvent(serializers.Serializer):
    id = serializers.CharField(
        help_text="reservation-<id>, maintenance-<id> or reserved-<id>-<occurrence start, epoch seconds>"
    )
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
        return Response({"resources": resources, "events": events, "now": iso_utc(now)})
