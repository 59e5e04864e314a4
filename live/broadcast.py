"""Sending live updates to the websocket groups (the channel layer, over Redis).

Every update is serialised to JSON once here and forwarded as it is by each connection
(``LiveConsumer.live_forward``): with hundreds of pages open, encoding per client would dominate.
A broadcast is a courtesy, never part of the change that caused it: if Redis is away, the
failure is logged and the report or booking stands (pages resynchronise when they reconnect).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
from typing import Any

from channels.layers import get_channel_layer
from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder

logger = logging.getLogger(__name__)

# Who gets what: the status cards come in two cuts (see reservations.fleet.for_viewer).
STATUS_ADMIN = "live.status.admin"
STATUS_USER = "live.status.user"
CALENDAR = "live.calendar"
EVENTS = "live.events"
ALERTS = "live.alerts"


def encode(payload: dict[str, Any]) -> str:
    return json.dumps(payload, cls=DjangoJSONEncoder, separators=(",", ":"))


def send(messages: list[tuple[str, dict[str, Any]]]) -> None:
    """Send each (group, payload) pair, in order; returns once they are in Redis (or failed)."""
    layer = get_channel_layer()
    if layer is None or not messages:
        return
    encoded = [(group, encode(payload)) for group, payload in messages]
    try:
        _sender.run(_send_all(layer, encoded))
    except Exception:
        logger.exception("live update not sent to %s", ", ".join(group for group, _ in encoded))


async def _send_all(layer: Any, messages: list[tuple[str, str]]) -> None:
    for group, text in messages:
        await layer.group_send(group, {"type": "live.forward", "text": text})


class _Sender:
    """An event loop in a thread of its own, for sending from sync code (views, tasks).

    ``async_to_sync`` would start a loop per call, and the channel layer opens its Redis
    connections per loop: a new connection for every broadcast. This loop lives as long as the
    process (a forked child starts its own), so the connections are reused; and it serves callers
    that run an event loop themselves, which ``async_to_sync`` refuses.
    """

    TIMEOUT = 5.0

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.pid: int | None = None

    def loop(self) -> asyncio.AbstractEventLoop:
        with self.lock:
            if self._loop is None or self.pid != os.getpid():
                self._loop, self.pid = asyncio.new_event_loop(), os.getpid()
                threading.Thread(target=self._loop.run_forever, name="live-broadcast", daemon=True).start()
            return self._loop

    def run(self, coroutine: Any) -> Any:
        """Run ``coroutine`` on the loop and wait for it."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop()).result(self.TIMEOUT)

    def call(self, function: Any, *args: Any) -> None:
        """Have the loop call ``function(*args)``, without waiting."""
        self.loop().call_soon_threadsafe(function, *args)


_sender = _Sender()


class _TelemetryBatch:
    """Nodes' new readings, sent to the pages together, at most once every LIVE_TELEMETRY_BATCH_MS.

    One message per report would make a page of 100 nodes (each reporting every 5 s) take 20
    messages a second, and a web process with 500 pages open send 10,000. The first report after
    a quiet spell goes at once; reports that arrive within the interval after a send wait for the
    next one and go together, with the newest readings of each node only. A batch that comes spaced
    already (``at_once``: the ingest process's, one per stored batch) goes at once, so a report does not
    wait for two timers. Lives on the sender's loop: only that thread touches it.
    """

    def __init__(self) -> None:
        self.pending: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
        self.last_sent = float("-inf")
        self.scheduled = False
        self.sending: set[asyncio.Task[None]] = set()  # held until done: the loop keeps only weak references
        self.in_order = asyncio.Lock()  # first come, first sent: a node's newer readings never overtake its older

    def add(self, nodes: dict[str, tuple[dict[str, Any], dict[str, Any]]], at_once: bool) -> None:
        self.pending.update(nodes)
        loop = asyncio.get_running_loop()
        if at_once:
            self._flush_soon()
        elif not self.scheduled:
            self.scheduled = True
            delay = max(0.0, self.last_sent + settings.LIVE_TELEMETRY_BATCH_MS / 1000 - loop.time())
            loop.call_later(delay, self._due)

    def _due(self) -> None:
        self.scheduled = False
        self._flush_soon()

    def _flush_soon(self) -> None:
        task = asyncio.get_running_loop().create_task(self.flush())
        self.sending.add(task)
        task.add_done_callback(self.sending.discard)

    async def flush(self) -> None:
        # The readings are taken under the lock: batches that came while a send was slow go together, in
        # order, once it is done; a send that hangs (Redis away) is given up after the sender's timeout.
        async with self.in_order:
            if not self.pending:  # sent already, by a batch that came at once
                return
            self.last_sent = asyncio.get_running_loop().time()
            pending, self.pending = self.pending, {}
            messages = [
                (group, encode({"type": "telemetry", "nodes": {node: cuts[cut] for node, cuts in pending.items()}}))
                for cut, group in enumerate((STATUS_ADMIN, STATUS_USER))
            ]
            try:
                await asyncio.wait_for(_send_all(get_channel_layer(), messages), _Sender.TIMEOUT)
            except Exception:
                logger.exception("live telemetry of %s not sent", ", ".join(pending))


_telemetry = _TelemetryBatch()


def send_telemetry(nodes: dict[str, tuple[dict[str, Any], dict[str, Any]]], *, at_once: bool = False) -> None:
    """Nodes' new readings, each in the admin and the researcher cut (node name -> (admin, user)), sent
    together: batched, or at once when the caller spaces its sends itself (see _TelemetryBatch)."""
    if get_channel_layer() is not None:
        _sender.call(_telemetry.add, nodes, at_once)


def send_status(*, admin: dict[str, Any], user: dict[str, Any]) -> None:
    send([(STATUS_ADMIN, admin), (STATUS_USER, user)])


def send_calendar_change(*, node: str | None, start: str | None, end: str | None) -> None:
    """Bookings or maintenance of ``node`` changed between ``start`` and ``end`` (None: anything)."""
    send([(CALENDAR, {"type": "calendar", "node": node, "start": start, "end": end})])


def send_events(payload: dict[str, Any]) -> None:
    send([(EVENTS, payload)])


def send_alerts(payload: dict[str, Any]) -> None:
    """Alerts opened or resolved (alerts/records.py), to the admins following "alerts"."""
    send([(ALERTS, payload)])
