"""live.outages.LiveOutageGuard speaking ASGI with a server: what it sends and logs when the websocket stack below it
meets an outage, whatever state the connection is in. The server's side is two queues (what the client sent, what
the server was asked to send), as daphne and uvicorn hand them to the application; tests/outages/
test_redis_restart.py and test_database_restart.py run the guard in the real servers."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import pytest
import redis

from live.outages import CLOSE_UNAVAILABLE, LiveOutageGuard

AWAY = redis.ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")
PAUSED = "Live updates are paused while the portal waits for Redis."
SCOPE = {"type": "websocket", "path": "/ws/live/"}


def serve(inner: Any, *from_client: dict[str, Any]) -> list[dict[str, Any]]:
    """Run the guard around ``inner`` for one connection whose client sends ``from_client`` (and then nothing); what
    the server was asked to send. Fails if the guard is still waiting after a generous deadline."""

    async def connection() -> list[dict[str, Any]]:
        incoming: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        for message in from_client:
            incoming.put_nowait(message)
        sent: list[dict[str, Any]] = []

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        await asyncio.wait_for(LiveOutageGuard(inner)(SCOPE, incoming.get, send), timeout=30)
        return sent

    return asyncio.run(connection())


def test_an_outage_before_the_handshake_is_told_after_accepting_it():
    async def inner(scope, receive, send):
        raise AWAY  # the session's user or the channel layer, read before the consumer receives the connect

    sent = serve(inner, {"type": "websocket.connect"})
    assert [message["type"] for message in sent] == ["websocket.accept", "websocket.send", "websocket.close"]
    assert json.loads(sent[1]["text"]) == {"type": "error", "code": "redis_unavailable", "message": PAUSED}
    assert sent[2] == {"type": "websocket.close", "code": CLOSE_UNAVAILABLE, "reason": PAUSED}


def test_a_client_that_leaves_before_its_handshake_is_let_go_at_once():
    async def inner(scope, receive, send):
        raise AWAY

    sent = serve(inner, {"type": "websocket.disconnect", "code": 1001})  # no connect will ever come
    assert sent == []


def test_an_outage_met_after_the_connection_was_closed_is_one_warning_and_no_traceback(caplog):
    async def inner(scope, receive, send):
        """As LiveConsumer: LayerWatch closed it with the words, then leaving the groups met Redis away."""
        await receive()
        await send({"type": "websocket.accept"})
        await send({"type": "websocket.close", "code": CLOSE_UNAVAILABLE, "reason": PAUSED})
        raise AWAY

    with caplog.at_level(logging.INFO):
        sent = serve(inner, {"type": "websocket.connect"})
    assert [message["type"] for message in sent] == ["websocket.accept", "websocket.close"]  # nothing after the close
    records = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [(r.name, r.levelno) for r in records] == [("live.outages", logging.WARNING)]
    assert "redis_unavailable" in records[0].getMessage() and records[0].exc_info is None


def test_a_fault_in_our_code_after_the_close_is_still_raised():
    async def inner(scope, receive, send):
        await receive()
        await send({"type": "websocket.accept"})
        await send({"type": "websocket.close", "code": 1000})
        raise ZeroDivisionError("division by zero")

    with pytest.raises(ZeroDivisionError):
        serve(inner, {"type": "websocket.connect"})
