"""The cache that holds the rate limits (kernel/cache.py) is Redis, shared by every web process
(tests/live/test_two_web_processes.py shows that); with Redis away the API still answers, the limits
failing open, and says so in the log once, leaving Redis alone for a while."""

from __future__ import annotations

import logging
import threading

from django.core.cache import cache

from tests.api_helpers import client_for


def test_with_the_cache_away_the_api_answers_and_logs_it(alice, settings, caplog):
    settings.CACHES = {
        "default": {
            **settings.CACHES["default"],
            "LOCATION": "redis://127.0.0.1:9/0",  # nothing listens there
            "OPTIONS": {"socket_connect_timeout": 0.5, "socket_timeout": 0.5},
        }
    }
    with caplog.at_level(logging.WARNING, logger="kernel.cache"):
        answers = [client_for(alice).get("/api/v1/gpus/") for _ in range(3)]
    assert [answer.status_code for answer in answers] == [200, 200, 200]
    # Said once, then Redis is left alone for a while: no timeout added to each request, no flood of tracebacks.
    assert [record.getMessage() for record in caplog.records].count(
        "cache get failed: Redis is away; rate limits are off for the next 30 s"
    ) == 1


def test_the_rate_counts_live_in_redis_under_the_portals_prefix(alice, settings):
    from kernel.redis_client import redis_client

    client_for(alice).get("/api/v1/gpus/")
    prefix = settings.CACHES["default"]["KEY_PREFIX"]
    assert any(b"throttle_user" in key for key in redis_client().scan_iter(f"{prefix}:*"))
    assert cache.get("never-set") is None


def test_the_cache_objects_of_every_thread_share_one_client_and_its_connections():
    """Django makes a cache object per thread (and per request under ASGI); each opening its own Redis
    connections cost every API request a connection. They share one client, and so one pool."""
    from django.core.cache import caches

    objects, clients = [], []

    def use() -> None:
        mine = caches["default"]
        mine.get("anything")
        objects.append(mine)
        clients.append(mine._cache)

    threads = [threading.Thread(target=use) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len({id(mine) for mine in objects}) == 4  # Django's own: one per thread
    assert len({id(client) for client in clients}) == 1
    pool = clients[0]._get_connection_pool(write=False)
    assert len(pool._available_connections) + len(pool._in_use_connections) <= 4
