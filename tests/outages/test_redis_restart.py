"""The portal's Redis going away and coming back under booking traffic and open live pages (issue 37).

The portal (gunicorn with two uvicorn processes, as the Dockerfile runs it, each with a pool of 4 database
connections; tests/outages/test_database_restart.py runs portal.serve) runs on a redis-server of the test's own
(tests/nodes/broker_redis.py: REDIS_URL, so its cache, Celery broker and channel layer), which is killed for
DOWN_SECONDS while four API clients book and read and a live connection follows the calendar. Requests do not
need Redis (the rate limits are forgiven, lease pushes and mails wait for beat): nothing may be answered 500 and
every booking answered 201 is stored. The live connection is told, and closed with 4503, within PING_SECONDS;
one opened meanwhile too; after Redis answers, a new one subscribes within 5 s and hears bookings again. The
figures are printed (pytest -s).
"""

from __future__ import annotations

import time

import pytest
from django.db import connection
from websockets.exceptions import ConnectionClosed, InvalidHandshake

from live.outages import PING_SECONDS
from reservations.models import Reservation
from tests.agent.harness import wait_for
from tests.live.server import AsgiServer, ProductionServer, open_client
from tests.nodes.broker_redis import AclRedis
from tests.outages.traffic import Traffic, back_after, closing_words, make_lab, summary

pytestmark = [
    pytest.mark.postgres_only,
    pytest.mark.skipif(connection.vendor != "postgresql", reason="the server shares the test database"),
]

DOWN_SECONDS = 5.0
BACK_WITHIN_SECONDS = 5.0
PAUSED = "Live updates are paused while the portal waits for Redis."


def subscribed_again(server: AsgiServer, token: str):
    """A live connection that subscribed to the calendar, or None while the server still closes new ones."""
    try:
        client = open_client(server, token=token)
        client.subscribe("calendar")
    except (OSError, InvalidHandshake, ConnectionClosed, TimeoutError):  # closed with 4503 before "subscribed"
        return None
    return client


def test_redis_going_away_under_traffic_keeps_every_booking_and_live_pages_are_told_and_come_back(transactional_db):
    redis = AclRedis(database=0)
    lab = make_lab()
    server = ProductionServer(processes=2, REDIS_URL=redis.url, DB_POOL_MAX_SIZE="4", DEBUG="0")
    traffic: Traffic | None = None
    try:
        server.start()
        watcher = open_client(server, token=lab["tokens"][0])
        watcher.subscribe("calendar")
        traffic = Traffic(server.url, lab)
        traffic.start()
        traffic.wait_for_successes(time.monotonic(), 12)

        stopping = time.monotonic()
        redis.stop()
        told, code, reason = closing_words(watcher)
        told_after = time.monotonic() - stopping
        meanwhile, meanwhile_code, _ = closing_words(open_client(server, token=lab["tokens"][1]))
        time.sleep(max(0.0, stopping + DOWN_SECONDS - time.monotonic()))  # the outage's length, on purpose
        redis.start()
        answering = time.monotonic()
        back = wait_for(lambda: subscribed_again(server, lab["tokens"][2]), timeout=60, interval=0.1)
        assert back is not None, "no live connection subscribed after Redis came back"
        live_back_after = back - answering
        listener = subscribed_again(server, lab["tokens"][3])
        assert listener is not None
        traffic.wait_for_successes(answering, 12)
        heard = listener.wait_for(lambda message: message["type"] == "calendar", timeout=30)  # bookings go on
        traffic.stop()

        figures = {
            "Redis away (s)": round(answering - stopping, 2),
            "live connection told after (s)": round(told_after, 2),
            "live connections subscribe again after (s)": round(live_back_after, 2),
            "last failed request after Redis answered (s)": round(back_after(traffic, answering), 2),
            "slowest answer (s)": round(max(a.ended - a.started for a in traffic.answers), 2),
        }
        print("\nThe portal's Redis away under 4 booking clients (gunicorn, 2 processes):", figures)
        print("   answers:", summary(traffic))

        assert not [a for a in traffic.answers if a.status in (0, 500)]
        refused = [a for a in traffic.answers if a.status not in (200, 201)]
        assert all(a.status == 503 and a.retry_after and a.message for a in refused), refused[:5]
        booked = traffic.booked()
        assert len(booked) >= 8
        assert Reservation.objects.filter(pk__in=booked).count() == len(booked)
        log = server.log_path.read_text(errors="replace")
        assert "Internal Server Error" not in log

        assert code == 4503 and told[-1] == {"type": "error", "code": "redis_unavailable", "message": PAUSED}
        assert reason == PAUSED  # uvicorn passes the close frame's reason on
        assert told_after < PING_SECONDS + 3
        assert meanwhile_code == 4503 and meanwhile[-1]["message"] == PAUSED
        assert live_back_after < BACK_WITHIN_SECONDS
        assert heard["node"] == "outage-a100"
    finally:
        if traffic is not None:
            traffic.stop()
        server.stop()
        redis.stop()
