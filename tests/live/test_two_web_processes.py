"""Two web processes behind one portal, as a site scales out (docs/operations.md, "Scaling out"): a page
connected to one sees a booking made through the other (the channel layer fans out to every process), and an
API token's rate limit counts the requests of both (the cache is Redis: kernel/cache.py), so a second
process does not double it."""

from __future__ import annotations

from datetime import timedelta

import pytest
import requests
from django.db import connection
from django.utils import timezone

from tests.live.server import AsgiServer, open_client

pytestmark = [
    pytest.mark.postgres_only,
    pytest.mark.skipif(connection.vendor != "postgresql", reason="the servers share the test database"),
]


@pytest.fixture
def two_servers(live_lab):
    servers = [AsgiServer(API_RATE_PER_TOKEN="4/minute") for _ in range(2)]
    try:
        for server in servers:
            server.start()
        yield servers
    finally:
        for server in servers:
            server.stop()


def test_a_page_on_one_process_sees_a_booking_made_through_the_other_and_the_rate_is_shared(two_servers, live_lab):
    first, second = two_servers
    watcher = open_client(first, token=live_lab["admin_token"])
    watcher.subscribe("calendar")
    auth = {"Authorization": f"Bearer {live_lab['researcher_token']}"}
    start = (timezone.now() + timedelta(days=1)).replace(minute=0, second=0, microsecond=0)
    body = {
        "gpus": [live_lab["gpus"][0].pk],
        "start": start.isoformat(),
        "end": (start + timedelta(hours=1)).isoformat(),
    }

    made = requests.post(f"{second.url}/api/v1/reservations/", json=body, headers=auth, timeout=10)

    assert made.status_code == 201, made.text
    change = watcher.wait_for(lambda m: m["type"] == "calendar")
    assert (change["node"], change["start"]) == ("live-a100", start.isoformat())
    watcher.close()

    # 4 a minute for the token, over both processes: the booking above, then three more, alternating.
    codes = [
        requests.get(f"{server.url}/api/v1/gpus/", headers=auth, timeout=10).status_code
        for server in (first, second, first, second)
    ]
    assert codes == [200, 200, 200, 429]
