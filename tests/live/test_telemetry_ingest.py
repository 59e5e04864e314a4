"""Telemetry as production runs it: the web server queues each report and the ingest process
(``manage.py consume_telemetry``, the Procfile's "ingest") stores it; the status pages see the readings."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.models import Sum

from kernel.redis_client import redis_client
from nodes.models import GpuMinute, GpuTelemetry
from nodes.telemetry_queue import STREAM
from tests.agent.harness import terminate, wait_for
from tests.live.server import AsgiServer, heartbeat, open_client, post_agent, start_ingest, telemetry


@pytest.fixture
def queued_server(transactional_db):
    if connection.vendor != "postgresql":
        pytest.skip("the server and the ingest process share the test database: PostgreSQL only")
    redis_client().delete(STREAM)
    server = AsgiServer(TELEMETRY_INGEST="queue")
    server.start()
    yield server
    server.stop()
    redis_client().delete(STREAM)


def samples_stored(gpu) -> int:
    return GpuMinute.objects.filter(gpu=gpu).aggregate(samples=Sum("samples"))["samples"] or 0


def test_a_queued_report_is_stored_by_the_ingest_process_and_reaches_the_status_pages(queued_server, live_lab):
    page = open_client(queued_server, token=live_lab["researcher_token"])
    page.subscribe("status")
    post_agent(queued_server, live_lab, "heartbeat", heartbeat()).raise_for_status()
    page.wait_for(lambda m: m["type"] == "nodes" and m["nodes"][0]["online"])

    # No ingest process yet: the report is queued, answered, and not stored.
    answer = post_agent(queued_server, live_lab, "telemetry", telemetry(utilization=93))
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"stored": 1, "ignored_gpus": []}
    assert not GpuTelemetry.objects.exists()

    post_agent(queued_server, live_lab, "telemetry", telemetry(utilization=95)).raise_for_status()

    # The pages' own batching set to a minute: the ingest process's batches are spaced already, and each
    # goes to the pages at once (live.broadcast._TelemetryBatch), so a report waits for one timer, not two.
    ingest = start_ingest(LIVE_TELEMETRY_BATCH_MS="60000")
    try:
        # Both waiting reports in one batch: one message, with the node's newest readings.
        seen = page.wait_for(lambda m: m["type"] == "telemetry", timeout=30)["nodes"]["live-a100"]
        assert seen["gpus"][str(live_lab["gpus"][0].pk)]["utilization_pct"] == 95
        assert GpuTelemetry.objects.get(gpu=live_lab["gpus"][0]).utilization_pct == 95
        assert samples_stored(live_lab["gpus"][0]) == 2

        # While it runs, the next report follows within moments, not a minute later.
        post_agent(queued_server, live_lab, "telemetry", telemetry(utilization=12)).raise_for_status()
        seen = page.wait_for(lambda m: m["type"] == "telemetry", timeout=10)["nodes"]["live-a100"]
        assert seen["gpus"][str(live_lab["gpus"][0].pk)]["utilization_pct"] == 12
        assert wait_for(lambda: samples_stored(live_lab["gpus"][0]) == 3, timeout=10)
    finally:
        terminate(ingest)
    assert ingest.returncode == 0  # SIGTERM ends it between batches, cleanly
    page.close()
