"""The web server as the Dockerfile and docker-compose run it: gunicorn with uvicorn workers (portal/gunicorn_conf.py,
portal/gunicorn_worker.py). Several processes on one port serve the API and the websockets; the access log goes
through the portal's logging, so a calendar feed's secret is redacted from it; and the client's address is the
connection's, X-Forwarded-For being the portal's to read (NUM_PROXIES), not the server's; and websockets go
uncompressed."""

from __future__ import annotations

import json

import pytest
import requests
from django.db import connection

from tests.agent.harness import wait_for
from tests.live.server import ProductionServer, open_client

pytestmark = [
    pytest.mark.postgres_only,
    pytest.mark.skipif(connection.vendor != "postgresql", reason="the server shares the test database"),
]
SECRET = "Zk3" + "q" * 39  # a feed token of the wrong length: refused before any database read


def test_gunicorn_runs_its_processes_serves_api_and_websockets_and_logs_no_feed_secret(live_lab):
    server = ProductionServer(processes=2, LOG_FORMAT="json")
    server.start()
    written = lambda: server.log_path.read_text(errors="replace")  # noqa: E731
    try:
        auth = {"Authorization": f"Bearer {live_lab['researcher_token']}"}
        assert requests.get(f"{server.url}/api/v1/gpus/", headers=auth, timeout=10).status_code == 200
        watcher = open_client(server, token=live_lab["researcher_token"])
        snapshot = next(m for m in watcher.subscribe("status") if m["type"] == "nodes")
        assert "live-a100" in [node["name"] for node in snapshot["nodes"]]
        # The client offered permessage-deflate (websockets does by default); the server declines it, so no
        # update is compressed once per page (portal/gunicorn_worker.py).
        handshake = watcher.websocket
        assert "permessage-deflate" in handshake.request.headers["Sec-WebSocket-Extensions"]
        assert "Sec-WebSocket-Extensions" not in handshake.response.headers
        watcher.close()

        feed = f"/feeds/1.mine.{SECRET}.ics"
        spoofed = {"X-Forwarded-For": "203.0.113.9"}
        assert requests.get(f"{server.url}{feed}", headers=spoofed, timeout=10).status_code == 404
        assert wait_for(lambda: "/feeds/1.mine.[redacted].ics HTTP/1.1" in written(), timeout=10), written()
        # uvicorn writes the path as the client spelled it (issue 37): encoded, it is redacted all the same.
        assert requests.get(f"{server.url}/%66eeds%2F1%2Emine%2E{SECRET}.ics", timeout=10).status_code == 404
        assert wait_for(lambda: written().count("/feeds/1.mine.[redacted].ics HTTP/1.1") == 2, timeout=10), written()
    finally:
        server.stop()

    assert written().count("Booting worker with pid") == 2
    records = [json.loads(line) for line in written().splitlines() if line.startswith("{")]
    access = next(r for r in records if r["logger"] == "uvicorn.access" and "/feeds/" in r["message"])
    assert '"GET /feeds/1.mine.[redacted].ics HTTP/1.1" 404' in access["message"]
    assert access["message"].startswith("127.0.0.1:")  # not the address the header claims
    assert SECRET not in written()
    assert "203.0.113.9" not in written()
