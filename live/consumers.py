"""The one websocket endpoint, ``/ws/live/``: a page (or a script) subscribes to topics and gets
updates as they happen.

Protocol (JSON text frames):
    client -> {"subscribe": ["status", "calendar"]}       also {"unsubscribe": [...]}
    server -> {"type": "subscribed", "topics": [...]}
              {"type": "nodes", "full": true, "nodes": [...]}   the status snapshot, on subscribing
              {"type": "nodes", "nodes": [...]}                 fresh cards of the nodes that changed
              {"type": "telemetry", "nodes": {"<node>": {"last_seen": iso, "gpus": {"<gpu id>": reading}}}}
                                                                new readings, batched
              {"type": "calendar", "node": "gpu-a100" | null, "start": iso | null, "end": iso | null}
              {"type": "events", "node": "...", "events": [...]}  admins only
              {"type": "alerts", "full": true, "alerts": [...]}  the open alerts, on subscribing (admins)
              {"type": "alerts", "alerts": [...]}                alerts opened or resolved since
              {"type": "error", "code": "...", "message": "..."}

Topics, and who may follow them:
    status    everyone logged in; admins get the admin cut of the cards (reservations.fleet.for_viewer)
    calendar  everyone logged in; says only *where and when* something changed, and the page
              asks the calendar API again, so each user still gets exactly what the API shows them
    events    booking admins: what the node agents did and saw (grants, revocations, violations)
    alerts    booking admins: alerts as they open and resolve (alerts/, docs/alerts.md)

A connection that is not logged in is accepted only to be told why, then closed with 4401. Every
LIVE_RECHECK_SECONDS the connection checks that its user is still active (and its token still
valid); if not it closes with 4401, and if the user's admin role changed it closes with 4000 so
the page reconnects and gets the cut it is now entitled to. While the channel layer's Redis (or, at
connect, the database) is away, a connection is told so ({"type": "error", "code": "redis_unavailable", ...})
and closed with 4503; the page reconnects with backoff (live/outages.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings
from django.utils import timezone

from kernel.outages import Outage, outage_of
from live import broadcast
from live.outages import CLOSE_UNAVAILABLE, error_frame, layer_watch, paused_message

logger = logging.getLogger(__name__)

MAX_MESSAGE_CHARS = 4096
CLOSE_NOT_AUTHENTICATED = 4401
CLOSE_RECONNECT = 4000
TOPICS = ("status", "calendar", "events", "alerts")
ADMIN_TOPICS = {
    "events": "Only booking admins may follow the node agents' events.",
    "alerts": "Only booking admins may follow alerts.",
}


# After a server restart every open page reconnects at once: they share a snapshot built in the
# last SNAPSHOT_REUSE_SECONDS instead of each building its own (64 GPUs: ~20 ms apiece). A page
# may so miss an update of that last second; the next one (5 s at most) repairs it.
SNAPSHOT_REUSE_SECONDS = 1.0
_snapshots: dict[bool, tuple[float, str]] = {}


@database_sync_to_async
def status_snapshot(admin: bool) -> str:
    """The "status" topic's first message, as JSON text, in the admin or the researcher cut."""
    from reservations.fleet import fleet_status, for_viewer

    built = _snapshots.get(admin)
    if built is None or time.monotonic() - built[0] > SNAPSHOT_REUSE_SECONDS:
        nodes = for_viewer(fleet_status(history=True), admin=admin)
        text = broadcast.encode({"type": "nodes", "full": True, "now": timezone.now(), "nodes": nodes})
        built = _snapshots[admin] = (time.monotonic(), text)
    return built[1]


@database_sync_to_async
def alerts_snapshot() -> str:
    """The "alerts" topic's first message: every open alert (admins only)."""
    from alerts.selectors import open_alerts_data

    return broadcast.encode({"type": "alerts", "full": True, "alerts": open_alerts_data()})


class LiveConsumer(AsyncWebsocketConsumer):
    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            # Also when an outage ended the connection from below (live.outages.LiveOutageGuard closes it then):
            # no watchdog or group outlives it.
            await self._leave()

    async def connect(self) -> None:
        user = self.scope.get("user")
        await self.accept()
        if user is None or not user.is_authenticated:
            message = self.scope.get("auth_error") or "Log in to the portal to see live updates."
            await self._error("not_authenticated", message)
            await self.close(code=CLOSE_NOT_AUTHENTICATED)
            return
        self.user = user
        self.admin = user.is_booking_admin
        self.topics: dict[str, str] = {}  # topic -> the group it joined
        self.watchdog: asyncio.Task[None] | None = asyncio.create_task(self._watch())
        layer_watch().join(self)

    async def disconnect(self, code: int) -> None:
        await self._leave()

    async def _leave(self) -> None:
        layer_watch().leave(self)
        watchdog, self.watchdog = getattr(self, "watchdog", None), None
        if watchdog is not None:
            watchdog.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await watchdog
        groups = list(getattr(self, "topics", {}).values())
        if groups:
            self.topics = {}
        for group in groups:
            # With Redis away this cannot reach it; channels-redis forgets the group here all the same.
            with contextlib.suppress(Exception):
                await self.channel_layer.group_discard(group, self.channel_name)

    async def layer_lost(self, outage: Outage) -> None:
        """live.outages.LayerWatch: the channel layer's Redis went away; nothing more would arrive here."""
        await self.send(text_data=error_frame(outage))
        await self.close(code=CLOSE_UNAVAILABLE, reason=paused_message(outage))

    # --- from the client ----------------------------------------------------------------------

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if not hasattr(self, "topics"):
            return  # refused at connect; the close is on its way
        if text_data is None or len(text_data) > MAX_MESSAGE_CHARS:
            await self._error("bad_message", f"Send JSON text messages of at most {MAX_MESSAGE_CHARS} characters.")
            return
        try:
            message = json.loads(text_data)
        except ValueError:
            await self._error("bad_message", 'Not JSON. Send {"subscribe": ["status"]}.')
            return
        if not isinstance(message, dict) or not ({"subscribe", "unsubscribe"} & message.keys()):
            await self._error("bad_message", 'Send {"subscribe": [topics]} or {"unsubscribe": [topics]}.')
            return
        for verb in ("unsubscribe", "subscribe"):
            if verb not in message:
                continue
            topics = message[verb]
            if not isinstance(topics, list) or not all(isinstance(t, str) for t in topics):
                await self._error("bad_message", f'"{verb}" takes a list of topic names: {", ".join(TOPICS)}.')
                return
            for topic in dict.fromkeys(topics):
                await (self._subscribe(topic) if verb == "subscribe" else self._unsubscribe(topic))
        await self._send({"type": "subscribed", "topics": sorted(self.topics)})

    async def _subscribe(self, topic: str) -> None:
        if topic not in TOPICS:
            await self._error("unknown_topic", f"No topic '{topic[:40]}'. Topics: {', '.join(TOPICS)}.")
            return
        if topic in ADMIN_TOPICS and not self.admin:
            await self._error("forbidden", ADMIN_TOPICS[topic])
            return
        group = self._group(topic)
        if self.topics.get(topic) != group:
            await self.channel_layer.group_add(group, self.channel_name)
            self.topics[topic] = group
        if topic == "status":
            # Joined first, snapshot second: nothing that happens in between is lost.
            await self.send(text_data=await status_snapshot(self.admin))
        elif topic == "alerts":
            await self.send(text_data=await alerts_snapshot())

    async def _unsubscribe(self, topic: str) -> None:
        group = self.topics.pop(topic, None)
        if group is not None:
            await self.channel_layer.group_discard(group, self.channel_name)

    def _group(self, topic: str) -> str:
        if topic == "status":
            return broadcast.STATUS_ADMIN if self.admin else broadcast.STATUS_USER
        return {"calendar": broadcast.CALENDAR, "events": broadcast.EVENTS, "alerts": broadcast.ALERTS}[topic]

    # --- from the channel layer ---------------------------------------------------------------

    async def dispatch(self, message: dict[str, Any]) -> None:
        # Channels closes the stale database connections before every handler, by a hop to the one thread
        # that sync code shares (channels.db.aclose_old_connections). A forward touches no database, and
        # with 500 pages open those hops, one per page per update, took a quarter of a web process's CPU
        # (a profile under bench/live.py) and queued every delivery behind that thread. The handlers that
        # read the database do it through database_sync_to_async, which closes stale connections itself.
        if message.get("type") == "live.forward":
            await self.live_forward(message)
        else:
            await super().dispatch(message)

    async def live_forward(self, event: dict[str, Any]) -> None:
        """A broadcast, already JSON (live.broadcast encodes once for every client)."""
        await self.send(text_data=event["text"])

    # --- keeping the connection honest --------------------------------------------------------

    async def _watch(self) -> None:
        """Re-check the credentials every LIVE_RECHECK_SECONDS while the connection lasts."""
        while True:
            await asyncio.sleep(settings.LIVE_RECHECK_SECONDS)
            try:
                verdict = await self._recheck()
            except Exception as error:
                if outage_of(error) is None:
                    logger.exception("could not re-check the websocket of %s", self.user)
                else:  # the database away: the next check will do
                    logger.warning("could not re-check the websocket of %s: %s", self.user, error)
                continue
            if verdict == "gone":
                await self._error("not_authenticated", "Your session or token is no longer valid: log in again.")
                await self.close(code=CLOSE_NOT_AUTHENTICATED)
                return
            if verdict == "role":
                await self.close(code=CLOSE_RECONNECT)
                return

    @database_sync_to_async
    def _recheck(self) -> str:
        from django.contrib.auth import get_user_model

        user = get_user_model().objects.filter(pk=self.user.pk).first()
        token = self.scope.get("api_token")
        if user is None or not user.is_active:
            return "gone"
        if token is not None:
            token.refresh_from_db(fields=["revoked_at", "expires_at"])
            if token.state(timezone.now()) != "active":
                return "gone"
        elif self._session_ended():
            return "gone"
        return "role" if user.is_booking_admin != self.admin else "ok"

    def _session_ended(self) -> bool:
        session = self.scope.get("session")
        if session is None or session.session_key is None:
            return False
        return not session.exists(session.session_key)

    # --- sending ------------------------------------------------------------------------------

    async def _send(self, payload: dict[str, Any]) -> None:
        await self.send(text_data=broadcast.encode(payload))

    async def _error(self, code: str, message: str) -> None:
        await self._send({"type": "error", "code": code, "message": message})
