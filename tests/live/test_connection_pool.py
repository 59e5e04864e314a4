"""With DB_POOL_MAX_SIZE set (docker-compose sets it), a web process borrows PostgreSQL connections from a pool
of its own: many requests at once share at most that many connections, however many request threads daphne
runs (the exhaustion seen before: a connection per thread), and every request is still answered."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from django.db import connection

from tests.live.server import AsgiServer, database_url

pytestmark = [
    pytest.mark.postgres_only,
    pytest.mark.skipif(connection.vendor != "postgresql", reason="a pool of PostgreSQL connections"),
]
NAME = "gpubook-pool-test"


def connections_of_the_server() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", [NAME])
        return cursor.fetchone()[0]


def test_many_requests_at_once_share_the_pool_and_are_all_answered(live_lab):
    server = AsgiServer(DATABASE_URL=f"{database_url()}?application_name={NAME}", DB_POOL_MAX_SIZE="2")
    server.start()
    auth = {"Authorization": f"Bearer {live_lab['researcher_token']}"}
    most, done = 0, threading.Event()

    def watch() -> None:
        nonlocal most
        while not done.is_set():
            most = max(most, connections_of_the_server())
            time.sleep(0.005)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with ThreadPoolExecutor(max_workers=24) as clients:
            codes = list(
                clients.map(
                    lambda _: requests.get(f"{server.url}/api/v1/gpus/", headers=auth, timeout=30).status_code,
                    range(96),
                )
            )
    finally:
        done.set()
        watcher.join()
        server.stop()
    assert codes == [200] * 96
    assert 1 <= most <= 2
