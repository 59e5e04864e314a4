"""The reporter against a real local HTTP server: events in order through outages, bounded, never fatal."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from gpubook_agent import reporter as reporter_module
from gpubook_agent.config import config_from_values
from gpubook_agent.reporter import Reporter
from tests.agent.harness import free_port, wait_for

TOKEN = "gpn_secret-token"
TIMEOUT = 10.0


class Portal:
    """Answers POSTs with ``status`` and keeps those it accepted (200) as (path, authorization, body).

    ``hold_next_events()`` makes the next events POST wait until released and then fail with 503, so a
    test can act while a send is in flight.
    """

    def __init__(self, port: int = 0) -> None:
        self.status = 200
        self.accepted: list[tuple[str, str, dict[str, Any]]] = []
        self.refused = 0
        self._hold: threading.Event | None = None
        self.held = threading.Event()
        portal = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                status, hold = portal.status, None
                if self.path.endswith("/events/"):
                    hold, portal._hold = portal._hold, None
                if hold is not None:
                    portal.held.set()
                    hold.wait(TIMEOUT)
                    status = 503
                if status == 200:
                    portal.accepted.append((self.path, self.headers.get("Authorization", ""), body))
                else:
                    portal.refused += 1
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, args=(0.01,), daemon=True)
        self._thread.start()

    def hold_next_events(self) -> threading.Event:
        release = threading.Event()
        self._hold = release
        return release

    def bodies(self, endpoint: str) -> list[dict[str, Any]]:
        return [body for path, _, body in list(self.accepted) if path == f"/api/v1/agent/{endpoint}/"]

    def events(self) -> list[dict[str, Any]]:
        return [event for body in self.bodies("events") for event in body["events"]]

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def make_config(portal_url: str, seconds: float = 0.05) -> Any:
    return config_from_values(
        {
            "NODE_NAME": "gpu-a100",
            "BROKER_URL": "redis://127.0.0.1:1/0",
            "PORTAL_URL": portal_url,
            "ALLOW_INSECURE_PORTAL": "true",  # the test portal answers on http://127.0.0.1
            "AGENT_TOKEN": TOKEN,
            "LEASE_SECRET": "s3cret",
            "HEARTBEAT_SECONDS": str(seconds),
            "TELEMETRY_SECONDS": str(seconds),
        }
    )


@pytest.fixture
def portal() -> Iterator[Portal]:
    server = Portal()
    yield server
    server.stop()


@pytest.fixture
def reporters() -> Iterator[Callable[..., Reporter]]:
    """Make reporters; every one started is stopped at the end, whatever happened."""
    made: list[Reporter] = []

    def make(portal_url: str, seconds: float = 0.05) -> Reporter:
        reporter = Reporter(make_config(portal_url, seconds))
        made.append(reporter)
        return reporter

    yield make
    for reporter in made:
        reporter.stop()


def test_events_are_posted_with_the_node_token(portal, reporters):
    reporter = reporters(portal.url)
    reporter.start()

    reporter.event("granted", gpu="GPU-1", user="alice", reservation=7, message=None)

    assert wait_for(lambda: portal.events())
    path, authorization, _ = next(item for item in portal.accepted if item[0].endswith("/events/"))
    assert path == "/api/v1/agent/events/"
    assert authorization == f"Bearer {TOKEN}"
    (event,) = portal.events()
    assert event["kind"] == "granted"
    assert (event["gpu"], event["user"], event["reservation"]) == ("GPU-1", "alice", 7)
    assert "message" not in event  # None fields are left out
    assert event["at"].endswith("+00:00")


def test_every_report_carries_the_token(portal, reporters):
    reporter = reporters(portal.url)
    reporter.start()
    reporter.event("hello")

    assert wait_for(lambda: portal.bodies("heartbeat") and portal.bodies("telemetry") and portal.events())
    assert {authorization for _, authorization, _ in portal.accepted} == {f"Bearer {TOKEN}"}


def test_events_recorded_before_start_go_out_in_order(portal, reporters):
    reporter = reporters(portal.url)
    for number in range(5):
        reporter.event("tick", number=number)

    reporter.start()

    assert wait_for(lambda: len(portal.events()) == 5)
    assert [event["number"] for event in portal.events()] == [0, 1, 2, 3, 4]


def test_events_wait_for_a_closed_port_and_then_arrive_in_order(reporters, caplog):
    port = free_port()
    reporter = reporters(f"http://127.0.0.1:{port}")
    with caplog.at_level(logging.WARNING, logger="gpubook_agent.reporter"):
        reporter.start()
        for number in range(3):
            reporter.event("tick", number=number)
        assert wait_for(lambda: "cannot report to the portal" in caplog.text)
        for number in range(3, 6):
            reporter.event("tick", number=number)

        portal = Portal(port)  # the portal comes back on its address
        try:
            assert wait_for(lambda: len(portal.events()) == 6)
            assert [event["number"] for event in portal.events()] == [0, 1, 2, 3, 4, 5]
            assert wait_for(lambda: "portal reachable again" in caplog.text)
        finally:
            portal.stop()


def test_events_wait_while_the_portal_answers_503_and_then_arrive_in_order(portal, reporters):
    portal.status = 503
    reporter = reporters(portal.url)
    reporter.start()
    for number in range(3):
        reporter.event("tick", number=number)
    assert wait_for(lambda: portal.refused >= 3)  # events, telemetry and heartbeat all refused at least once
    reporter.event("tick", number=3)

    portal.status = 200

    assert wait_for(lambda: len(portal.events()) == 4)
    assert [event["number"] for event in portal.events()] == [0, 1, 2, 3]


def test_a_batch_the_portal_refuses_as_invalid_is_dropped_and_does_not_block_later_events(portal, reporters, caplog):
    portal.status = 400
    reporter = reporters(portal.url)
    reporter.event("tick", number=0)
    reporter.start()
    assert wait_for(lambda: portal.refused >= 1)
    portal.status = 200
    reporter.event("tick", number=1)

    assert wait_for(lambda: len(portal.events()) == 1)
    assert [event["number"] for event in portal.events()] == [1]
    assert "refused a events report; dropping it" in caplog.text


def test_stop_delivers_the_events_still_buffered(portal, reporters):
    reporter = reporters(portal.url, seconds=60)
    reporter.event("tick", number=7)  # recorded, but the thread never ran to send it
    reporter.stop()

    assert [event["number"] for event in portal.events()] == [7]


def test_the_buffer_is_bounded_and_drops_the_oldest(portal, reporters, monkeypatch):
    monkeypatch.setattr(reporter_module, "EVENT_BUFFER", 3)  # read when the Reporter is built
    portal.status = 503
    reporter = reporters(portal.url)
    for number in range(5):
        reporter.event("tick", number=number)
    reporter.start()
    assert wait_for(lambda: portal.refused >= 1)

    portal.status = 200

    assert wait_for(lambda: len(portal.events()) == 3)
    assert [event["number"] for event in portal.events()] == [2, 3, 4]


def test_a_failed_batch_put_back_into_a_full_buffer_drops_the_oldest_not_the_newest(portal, reporters, monkeypatch):
    monkeypatch.setattr(reporter_module, "EVENT_BUFFER", 3)
    reporter = reporters(portal.url)
    reporter.event("tick", number=0)
    reporter.event("tick", number=1)
    release = portal.hold_next_events()
    reporter.start()
    assert portal.held.wait(TIMEOUT)  # events 0 and 1 are in flight, out of the buffer

    reporter.event("tick", number=2)  # meanwhile the buffer fills up again
    reporter.event("tick", number=3)
    release.set()  # the in-flight POST fails with 503: 0, 1 go back in front of 2, 3; one must go

    assert wait_for(lambda: len(portal.events()) == 3)
    assert [event["number"] for event in portal.events()] == [1, 2, 3]


def test_heartbeat_and_telemetry_come_from_their_callables_with_sent_at(portal, reporters):
    reporter = reporters(portal.url)
    reporter.heartbeat = lambda: {"applied_version": 7, "acls": {"GPU-1": ["alice"]}}
    reporter.telemetry = lambda: [{"uuid": "GPU-1", "utilization_pct": 55}]
    reporter.start()

    assert wait_for(lambda: len(portal.bodies("heartbeat")) >= 2 and len(portal.bodies("telemetry")) >= 2)
    heartbeat, telemetry = portal.bodies("heartbeat")[0], portal.bodies("telemetry")[0]
    assert heartbeat["applied_version"] == 7
    assert heartbeat["acls"] == {"GPU-1": ["alice"]}
    assert heartbeat["sent_at"].endswith("+00:00")
    assert telemetry["gpus"] == [{"uuid": "GPU-1", "utilization_pct": 55}]
    assert telemetry["sent_at"].endswith("+00:00")


def test_a_failing_telemetry_callable_is_logged_and_the_reporter_carries_on(portal, reporters, caplog):
    calls = {"telemetry": 0}

    def telemetry() -> list[dict[str, Any]]:
        calls["telemetry"] += 1
        if calls["telemetry"] <= 2:
            raise RuntimeError("NVML went away")
        return [{"uuid": "GPU-1"}]

    reporter = reporters(portal.url)
    reporter.telemetry = telemetry
    with caplog.at_level(logging.ERROR, logger="gpubook_agent.reporter"):
        reporter.start()
        assert wait_for(lambda: portal.bodies("telemetry"))  # the third try goes through
        reporter.event("still-here")
        assert wait_for(lambda: portal.events())

    assert reporter._thread is not None and reporter._thread.is_alive()
    assert portal.bodies("heartbeat")
    assert "building the telemetry report failed" in caplog.text
    assert "NVML went away" in caplog.text


def test_stop_ends_the_thread(portal, reporters):
    reporter = reporters(portal.url, seconds=60)
    reporter.start()
    assert wait_for(lambda: portal.bodies("heartbeat"))

    reporter.stop()

    assert reporter._thread is not None
    assert not reporter._thread.is_alive()
