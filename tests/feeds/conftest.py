"""Helpers for the calendar feed tests: fetch a feed as a calendar app would (no login) and read it
with vobject, a parser independent of the icalendar library that writes it."""

from __future__ import annotations

from datetime import UTC, datetime

import vobject
from django.test import Client

from feeds.selectors import feed_links


def feed_path(user, node=None) -> str:
    """The path of ``user``'s feed: their own bookings, or ``node``'s."""
    name = None if node is None else node.name
    (link,) = [link for link in feed_links(user=user) if link.node == name]
    return link.path


def fetch(path: str, **headers):
    """GET as a calendar app: a fresh client with no session."""
    return Client().get(path, **headers)


def parse(response):
    assert response.status_code == 200, response.content
    assert response["Content-Type"] == "text/calendar; charset=utf-8"
    return vobject.readOne(response.content.decode("utf-8"))


def read_feed(user, node=None):
    return parse(fetch(feed_path(user, node)))


def events(calendar) -> dict[str, object]:
    """The events by UID."""
    return {event.uid.value: event for event in getattr(calendar, "vevent_list", [])}


def event_of(calendar, reservation):
    return events(calendar)[f"reservation-{reservation.pk}@testserver"]


def instant(event, name: str) -> datetime:
    """DTSTART/DTEND as parsed, which must carry a zone (never floating), in UTC."""
    value = getattr(event, name).value
    assert value.tzinfo is not None, f"{name} is a floating time"
    return value.astimezone(UTC)


def text(event, name: str) -> str | None:
    prop = getattr(event, name, None)
    return None if prop is None else prop.value
