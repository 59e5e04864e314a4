"""Sending live updates to the websocket groups (the channel layer, over Redis).

Every update is serialised to JSON once here and forwarded as it is by each connection
(``LiveConsumer.live_forward``): with hundreds of pages open, encoding per client would dominate.
A broadcast is a courtesy, never part of the change that caused it: if Redis is away, the
failure is logged and the report or booking stands (pages resynchronise when they reconnect).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.core.serializers.json import DjangoJSONEncoder

logger = logging.getLogger(__name__)

# Who gets what: the status cards come in two cuts (see nodes.status.for_viewer).
STATUS_ADMIN = "live.status.admin"
STATUS_USER = "live.status.user"
CALENDAR = "live.calendar"
EVENTS = "live.events"


def encode(payload: dict[str, Any]) -> str:
    return json.dumps(payload, cls=DjangoJSONEncoder, separators=(",", ":"))


def send(messages: list[tuple[str, dict[str, Any]]]) -> None:
    """Send each (group, payload) pair; all of them over one connection to the layer."""
    layer = get_channel_layer()
    if layer is None or not messages:
        return
    try:
        async_to_sync(_send_all)(layer, [(group, encode(payload)) for group, payload in messages])
    except Exception:
        logger.exception("live update not sent to %s", ", ".join(group for group, _ in messages))


async def _send_all(layer: Any, messages: list[tuple[str, str]]) -> None:
    for group, text in messages:
        await layer.group_send(group, {"type": "live.forward", "text": text})


def send_status(*, admin: dict[str, Any], user: dict[str, Any]) -> None:
    send([(STATUS_ADMIN, admin), (STATUS_USER, user)])


def send_calendar_change(*, node: str | None, start: str | None, end: str | None) -> None:
    """Bookings or maintenance of ``node`` changed between ``start`` and ``end`` (None: anything)."""
    send([(CALENDAR, {"type": "calendar", "node": node, "start": start, "end": end})])


def send_events(payload: dict[str, Any]) -> None:
    send([(EVENTS, payload)])
