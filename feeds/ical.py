"""Building a feed as iCalendar (RFC 5545) with the ``icalendar`` library.

Times are written in UTC (``DTSTART:20300107T090000Z``): an instant every client reads the same way,
with no VTIMEZONE to get wrong; clients show it in their own zone. X-WR-TIMEZONE names the user's
zone for clients (Google, Apple) that use it as the subscribed calendar's default, and the owner's
description states the times in that zone too.

Who sees what, as on the calendar page, but stricter: a feed URL ends up on calendar providers'
servers, so the purpose, the host and the GPUs' UUIDs are written only into the subscriber's own
bookings, never anyone else's, whoever the subscriber is (admins included). Others' live bookings
show the holder's name; others' cancelled or rejected bookings show no name.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, timedelta
from typing import Any

from icalendar import Calendar, Event, vDuration

from feeds.selectors import FeedBooking
from nodes.models import cuda_visible_devices
from reservations.models import Reservation
from reservations.timegrid import format_day_time

Status = Reservation.Status

PRODID = "-//GPU booking portal//Calendar feeds//EN"
# Asks clients that honour it (Outlook, Apple; RFC 7986) to poll this often; Google decides itself.
REFRESH = timedelta(hours=1)
_ICAL_STATUS = {
    Status.APPROVED: "CONFIRMED",
    Status.PENDING: "TENTATIVE",
    Status.OFFERED: "TENTATIVE",  # held for its person from the waitlist until they claim or decline it
    Status.CANCELLED: "CANCELLED",
    Status.REJECTED: "CANCELLED",
}


@dataclass(frozen=True)
class FeedContext:
    """What a feed is about and for whom; the URLs are absolute."""

    subscriber: Any  # the user whose URL it is
    node: str | None  # None: the subscriber's own bookings
    uid_host: str
    mine_url: str  # "My reservations"
    calendar_url: str  # the calendar page


def gpu_list(booking: FeedBooking) -> str:
    """'GPU 0, 1'."""
    return "GPU " + ", ".join(str(gpu.index) for gpu in booking.gpus)


def summary(booking: FeedBooking, context: FeedContext) -> str:
    mine = booking.owner_id == context.subscriber.pk
    if context.node is None:
        text = f"{booking.node}: {gpu_list(booking)}"
    elif booking.status in Reservation.LIVE_STATUSES or mine:
        text = f"{gpu_list(booking)} on {booking.node} — {booking.owner}"
    else:
        text = f"{gpu_list(booking)} on {booking.node}"
    if booking.status == Status.PENDING:
        text += " (pending approval)"
    elif booking.status == Status.OFFERED:
        text += " (offered from the waitlist)"
    elif booking.status in (Status.CANCELLED, Status.REJECTED):
        text += f" ({booking.status})"
    return text


def owner_description(booking: FeedBooking, context: FeedContext) -> str:
    """What "My reservations" tells the holder: how to use the GPUs, and the times in their zone."""
    user = context.subscriber
    zone = user.zone
    state = {
        Status.APPROVED: "approved",
        Status.PENDING: "pending approval: the GPUs are yours only once an admin approves it",
        Status.OFFERED: "offered from the waitlist: claim or decline it on your waitlist before it passes on",
        Status.CANCELLED: "cancelled",
        Status.REJECTED: "rejected",
    }[Status(booking.status)]
    lines = [f"Reservation #{booking.id}, {state}."]
    if booking.series_id is not None:
        # Each occurrence of a series is its own event (its own UID, status and times): a client need not
        # expand an RRULE, and one cancelled occurrence is simply a cancelled event.
        lines.append(f"One occurrence of recurring booking (series) #{booking.series_id}.")
    if booking.purpose:
        lines.append(f"Purpose: {booking.purpose}")
    models = ", ".join(sorted({f"{gpu.model} ({gpu.memory_gb} GB)" for gpu in booking.gpus}))
    lines.append(f"{gpu_list(booking)} on {booking.node} ({booking.hostname}): {models}.")
    ends = "released" if booking.released else "to"
    start, end = (
        format_day_time(booking.start, zone, abbreviation=True),
        format_day_time(booking.end, zone, abbreviation=True),
    )
    lines.append(f"From {start} {ends} {end} ({zone.key}).")
    if booking.status == Status.APPROVED:  # as on "My reservations": access once approved
        if user.unix_username:
            indices = ",".join(str(gpu.index) for gpu in booking.gpus)
            lines += [
                "",
                f"ssh {user.unix_username}@{booking.hostname}",
                f"export CUDA_VISIBLE_DEVICES={cuda_visible_devices(booking.gpus)}",
                "# the same GPUs by index (nvidia-smi's numbering):",
                f"#   CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES={indices}",
            ]
        else:
            lines += ["", "Set your unix username on your profile to get access to these GPUs."]
    lines += ["", f"Manage it: {context.mine_url}"]
    return "\n".join(lines)


def build_event(booking: FeedBooking, context: FeedContext) -> Event:
    mine = booking.owner_id == context.subscriber.pk
    event = Event()
    event.add("uid", f"reservation-{booking.id}@{context.uid_host}")
    event.add("dtstamp", booking.changed_at.astimezone(UTC))
    event.add("created", booking.created_at.astimezone(UTC))
    event.add("last-modified", booking.changed_at.astimezone(UTC))
    event.add("sequence", booking.changes)
    event.add("dtstart", booking.start.astimezone(UTC))
    event.add("dtend", booking.end.astimezone(UTC))
    event.add("summary", summary(booking, context))
    event.add("status", _ICAL_STATUS[Status(booking.status)])
    # Cancelled and rejected slots no longer block anyone's time.
    event.add("transp", "OPAQUE" if booking.status in Reservation.LIVE_STATUSES else "TRANSPARENT")
    if mine:
        event.add("location", f"{booking.node} ({booking.hostname})")
        event.add("description", owner_description(booking, context))
        event.add("url", context.mine_url)
    else:
        event.add("location", booking.node)
        if booking.status in Reservation.LIVE_STATUSES:
            event.add("description", f"Booked by {booking.owner}. The calendar: {context.calendar_url}")
        event.add("url", context.calendar_url)
    return event


def build_calendar(bookings: Sequence[FeedBooking], context: FeedContext) -> bytes:
    user = context.subscriber
    name = "My GPU bookings" if context.node is None else f"GPU bookings on {context.node}"
    calendar = Calendar()
    calendar.add("prodid", PRODID)
    calendar.add("version", "2.0")
    calendar.add("calscale", "GREGORIAN")
    calendar.add("name", name)
    calendar.add("x-wr-calname", name)
    calendar.add(
        "x-wr-caldesc",
        f"{user.get_username()}'s GPU bookings" if context.node is None else f"Every booking on node {context.node}",
    )
    calendar.add("x-wr-timezone", user.zone.key)
    calendar.add("refresh-interval", REFRESH, parameters={"VALUE": "DURATION"})
    calendar.add("x-published-ttl", vDuration(REFRESH))
    for booking in bookings:
        calendar.add_component(build_event(booking, context))
    return calendar.to_ical()
