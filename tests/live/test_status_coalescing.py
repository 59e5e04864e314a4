"""A booking's status cards are built by a worker, coalesced (live/status.py): a burst of bookings on a node
reaches every page as one message holding all of them, built off the request; the next change after it
gets a message of its own; with Redis away the request builds the cards itself. A real Celery worker, a
real daphne server and a real websocket client."""

from __future__ import annotations

from datetime import timedelta

import pytest
from celery.contrib.testing.worker import start_worker
from django.db import transaction
from django.utils import timezone

from kernel.redis_client import redis_client
from live.status import PENDING_KEY
from portal.celery import app
from reservations.services import reservation_create
from tests.live.server import open_client

pytestmark = pytest.mark.postgres_only


def nodes_messages(watcher, *, within: float) -> list[dict]:
    """Every "nodes" message that arrives within ``within`` seconds."""
    found = []
    while True:
        try:
            found.append(watcher.wait_for(lambda m: m["type"] == "nodes", timeout=within))
        except TimeoutError:
            return found


def next_holders(message) -> dict[int, str]:
    node = next(n for n in message["nodes"] if n["name"] == "live-a100")
    return {gpu["index"]: (gpu.get("next") or {}).get("user") for gpu in node["gpus"]}


def book(live_lab, gpu, hours_ahead):
    start = (timezone.now() + timedelta(days=1, hours=hours_ahead)).replace(minute=0, second=0, microsecond=0)
    gpus = live_lab["gpus"]
    return reservation_create(
        user=live_lab["researcher"], gpus=[gpus[gpu]], start=start, end=start + timedelta(hours=1)
    )


def test_a_burst_of_bookings_is_one_message_built_by_the_worker(asgi_server, live_lab, settings):
    settings.LIVE_STATUS_COALESCE_SECONDS = 0.3
    redis_client().delete(PENDING_KEY.format(node_id=live_lab["node"].pk))
    watcher = open_client(asgi_server, token=live_lab["admin_token"])
    watcher.subscribe("status")
    with start_worker(app, pool="solo", perform_ping_check=False, shutdown_timeout=10):
        with transaction.atomic():  # four changes committed together: four on-commit reactions back to back
            for gpu, hours in ((0, 0), (0, 2), (1, 0), (1, 4)):
                book(live_lab, gpu, hours)
        burst = nodes_messages(watcher, within=3)
        assert len(burst) == 1
        assert next_holders(burst[0]) == {0: "rita", 1: "rita"}
        assert not redis_client().exists(PENDING_KEY.format(node_id=live_lab["node"].pk))  # cleared by the task

        book(live_lab, 0, 6)  # after the burst's message: a message of its own
        assert len(nodes_messages(watcher, within=3)) == 1
    watcher.close()


def test_with_redis_away_the_request_builds_the_cards_itself(asgi_server, live_lab, settings):
    settings.LIVE_STATUS_COALESCE_SECONDS = 0.3
    watcher = open_client(asgi_server, token=live_lab["admin_token"])
    watcher.subscribe("status")
    settings.REDIS_URL = "redis://127.0.0.1:9/0"  # nothing listens there: the marks cannot be set
    redis_client.cache_clear()
    try:
        book(live_lab, 1, 0)  # no worker runs: only the request's own build can send the cards
    finally:
        redis_client.cache_clear()
    assert next_holders(watcher.wait_for(lambda m: m["type"] == "nodes"))[1] == "rita"
    watcher.close()
