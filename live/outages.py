"""The live websocket while what it needs is away: the channel layer's Redis, or the database at connect.

A page's connection then ends with words rather than a dropped socket (close code 1006) or a failed handshake:
the server accepts, sends ``{"type": "error", "code": "redis_unavailable", "message": "Live updates are paused
..."}`` and closes with ``CLOSE_UNAVAILABLE`` (4503; the message is also the close reason where the server
passes one on: uvicorn does, daphne does not). static/js/live.js shows the words and reconnects with backoff; the
page loads what it missed once it is back (its ``onOpen``).

- ``LiveOutageGuard`` wraps the websocket stack (portal/asgi.py): an outage raised anywhere below it (the session's
  user read at connect, the channel layer's subscription, a status snapshot) ends the connection so.
- ``LayerWatch``: a connection that is already open hears nothing when Redis goes away (channels-redis retries
  its subscriptions quietly and the broadcasts of the meantime are lost). One task per web process pings the
  channel layer's Redis every ``PING_SECONDS`` while connections are open, and closes them all, with the words,
  when it does not answer: each page says so, and reconnects and catches up once Redis is back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, Protocol

import redis
import redis.asyncio
from django.conf import settings

from kernel.outages import REDIS_UNAVAILABLE, Outage, outage_of
from live.broadcast import encode

logger = logging.getLogger(__name__)

CLOSE_UNAVAILABLE = 4503
PING_SECONDS = 2.0


def paused_message(outage: Outage) -> str:
    """What the page shows while it reconnects (at most 123 bytes: it is also the close frame's reason)."""
    return f"Live updates are paused while the portal waits for {outage.what}."


def error_frame(outage: Outage) -> str:
    return encode({"type": "error", "code": outage.code, "message": paused_message(outage)})


class LiveOutageGuard:
    """ASGI middleware around the websocket routes: an outage below ends the connection with words and 4503."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        seen = {"connect": False, "accepted": False, "closed": False}

        async def receiving() -> dict[str, Any]:
            message = await receive()
            if message["type"] == "websocket.connect":
                seen["connect"] = True
            elif message["type"] == "websocket.disconnect":
                seen["closed"] = True
            return message

        async def sending(message: dict[str, Any]) -> None:
            if message["type"] == "websocket.accept":
                seen["accepted"] = True
            elif message["type"] == "websocket.close":
                seen["closed"] = True
            await send(message)

        try:
            return await self.inner(scope, receiving, sending)
        except Exception as error:
            outage = outage_of(error)
            if outage is None:
                raise  # ours: the server logs it with its trace
            cause = f"{type(error).__name__}: {_first_line(error)}"
            trace = error if outage.logged_with_trace else None
            if seen["closed"]:
                # Closed already (LayerWatch told the page, or the client left): nothing to send, and no trace for
                # an outage met on the way out (leaving the groups of a Redis that is away).
                logger.warning("websocket already closed when it met %s (%s)", outage.code, cause, exc_info=trace)
                return None
            logger.warning("websocket closed with %s: %s (%s)", CLOSE_UNAVAILABLE, outage.code, cause, exc_info=trace)
            # A handshake must be accepted before a close can carry a code (a refusal is a bare HTTP 403).
            while not seen["connect"]:
                message = await receive()
                if message["type"] == "websocket.disconnect":
                    return None  # the client left before its handshake: no one to tell
                seen["connect"] = message["type"] == "websocket.connect"
            if not seen["accepted"]:
                await send({"type": "websocket.accept"})
            await send({"type": "websocket.send", "text": error_frame(outage)})
            await send({"type": "websocket.close", "code": CLOSE_UNAVAILABLE, "reason": paused_message(outage)})


def _first_line(error: BaseException) -> str:
    words = str(error).strip()
    return words.splitlines()[0] if words else ""


class Watched(Protocol):
    async def layer_lost(self, outage: Outage) -> None: ...


class LayerWatch:
    """The open connections of this process's event loop, and the task that pings Redis for them."""

    def __init__(self) -> None:
        self.connections: set[Watched] = set()
        self.task: asyncio.Task[None] | None = None

    def join(self, connection: Watched) -> None:
        self.connections.add(connection)
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self._watch())

    def leave(self, connection: Watched) -> None:
        self.connections.discard(connection)

    async def _watch(self) -> None:
        client = redis.asyncio.Redis.from_url(
            settings.CHANNEL_LAYER_URL, socket_timeout=PING_SECONDS, socket_connect_timeout=PING_SECONDS
        )
        try:
            while self.connections:
                await asyncio.sleep(PING_SECONDS)
                try:
                    await client.ping()
                except (redis.ConnectionError, redis.TimeoutError, OSError) as error:
                    lost = list(self.connections)
                    logger.warning("channel layer's Redis away (%s): closing %d connections", error, len(lost))
                    for connection in lost:
                        self.connections.discard(connection)
                        with contextlib.suppress(Exception):
                            await connection.layer_lost(REDIS_UNAVAILABLE)
        finally:
            with contextlib.suppress(Exception):
                await client.aclose()


_watches: dict[asyncio.AbstractEventLoop, LayerWatch] = {}


def layer_watch() -> LayerWatch:
    """This event loop's watch (one per web process; tests may run several loops)."""
    loop = asyncio.get_running_loop()
    for stale in [other for other in _watches if other.is_closed()]:
        del _watches[stale]
    return _watches.setdefault(loop, LayerWatch())
