"""The pull, the agent's side: the reporter against a real local HTTP server standing in for the
portal, offering what it fetches to a real enforcer (simulated GPUs, no ACL changes: no leases).

The reporter's pull logic takes the monotonic time as an argument, so these tests say when things
happen instead of sleeping; the agent process and the end-to-end test run it on its own thread.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import shutil
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from gpubook_agent.config import AgentConfig, config_from_values
from gpubook_agent.enforcer import Enforcer
from gpubook_agent.gpus import open_backend
from gpubook_agent.reporter import MAX_PULL_INTERVAL, Reporter
from gpubook_agent.signing import signed
from gpubook_agent.snapshot import MAX_SNAPSHOT_BYTES
from gpubook_agent.store import SnapshotStore

PULL_AFTER = 15.0
TOKEN = "gpn_pull-test"


class Portal:
    """Answers GET /api/v1/agent/snapshot/ with ``status`` and ``body`` (a callable, so each pull can
    issue a new version, as the portal does), and counts the GETs with the token they carried."""

    def __init__(self) -> None:
        self.status = 200
        self.body: Any = lambda: b"{}"
        self.cut_short = False  # announce more than is sent, then close
        self.gets: list[str] = []
        portal = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                portal.gets.append(self.headers.get("Authorization", ""))
                body = portal.body()
                self.send_response(portal.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body) * (2 if portal.cut_short else 1)))
                self.end_headers()
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the agent reads no further
                    self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, args=(0.01,), daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@dataclass
class Agent:
    config: AgentConfig
    enforcer: Enforcer
    reporter: Reporter
    events: list[tuple[str, dict[str, Any]]]

    def snapshot(self, version: int, *, secret: str | None = None, issued_at: datetime | None = None) -> dict:
        body = {
            "node": self.config.node_name,
            "version": version,
            "issued_at": (issued_at or datetime.now(UTC)).isoformat(),
            "horizon_end": (datetime.now(UTC) + timedelta(hours=24)).isoformat(),
            "leases": [],
        }
        return signed(body, secret or self.config.lease_secret)

    def refusals(self) -> list[str]:
        return [fields["message"] for kind, fields in self.events if kind == "snapshot_refused"]


@pytest.fixture
def portal() -> Iterator[Portal]:
    server = Portal()
    yield server
    server.stop()


@pytest.fixture
def agent(portal) -> Iterator[Agent]:
    """A reporter wired to a real enforcer as main.py wires them (threads not started)."""
    home = Path(tempfile.mkdtemp(prefix="gpbt-pull-", dir="/tmp"))
    try:
        config = config_from_values(
            {
                "NODE_NAME": f"test-{secrets.token_hex(4)}",
                "BROKER_URL": "redis://127.0.0.1:1/0",
                "PORTAL_URL": portal.url,
                "ALLOW_INSECURE_PORTAL": "true",
                "AGENT_TOKEN": TOKEN,
                "LEASE_SECRET": secrets.token_hex(32),
                "STATE_DIR": str(home / "state"),
                "BACKEND": "simulated",
                "SIMULATED_GPUS": "1",
                "PULL_AFTER_SECONDS": str(PULL_AFTER),
            }
        )
        backend = open_backend("simulated", device_dir=config.device_dir, node_name=config.node_name, simulated_gpus=1)
        events: list[tuple[str, dict[str, Any]]] = []
        enforcer = Enforcer(
            config=config,
            backend=backend,
            store=SnapshotStore(config.state_dir),
            report=lambda kind, **fields: events.append((kind, fields)),
        )
        reporter = Reporter(config)
        reporter.seen_version = lambda: enforcer.seen_version
        reporter.offer = enforcer.offer
        yield Agent(config, enforcer, reporter, events)
    finally:
        shutil.rmtree(home, ignore_errors=True)


def serve(portal: Portal, agent: Agent, first_version: int) -> None:
    """The portal issues a new version for each pull, as GET /api/v1/agent/snapshot/ does."""
    versions = iter(range(first_version, first_version + 1000))
    portal.body = lambda: json.dumps(agent.snapshot(next(versions))).encode()


def test_a_node_behind_the_portal_pulls_after_pull_after_seconds_and_applies_the_snapshot(portal, agent):
    serve(portal, agent, first_version=6)
    agent.enforcer.offer(agent.snapshot(4))
    reporter = agent.reporter

    reporter.note_portal_version(5, now=100.0)  # a heartbeat reply: the portal issued 5, this node has 4

    assert reporter.pull_due() == 100.0 + PULL_AFTER
    assert portal.gets == []
    assert reporter.pull(now=115.0) == "applied"
    assert portal.gets == [f"Bearer {TOKEN}"]
    assert agent.enforcer.applied_version == 6
    assert reporter.pull_due() is None


def test_a_later_reply_does_not_put_the_pull_off(portal, agent):
    """Due PULL_AFTER_SECONDS after the *first* reply that showed the node behind, however many follow."""
    agent.enforcer.offer(agent.snapshot(4))
    reporter = agent.reporter

    reporter.note_portal_version(5, now=100.0)
    reporter.note_portal_version(5, now=110.0)
    reporter.note_portal_version(6, now=120.0)

    assert reporter.pull_due() == 100.0 + PULL_AFTER


def test_a_push_that_arrives_meanwhile_makes_the_pull_unneeded(portal, agent):
    agent.enforcer.offer(agent.snapshot(4))
    reporter = agent.reporter
    reporter.note_portal_version(5, now=100.0)

    assert agent.enforcer.offer(agent.snapshot(5)) == "applied"  # the push, a moment late

    assert reporter.pull(now=115.0) is None
    assert portal.gets == []
    reporter.note_portal_version(5, now=120.0)
    assert reporter.pull_due() is None


def test_a_node_level_with_the_portal_never_pulls(portal, agent):
    agent.enforcer.offer(agent.snapshot(5))

    for version in (0, 3, 5):
        agent.reporter.note_portal_version(version, now=100.0)

    assert agent.reporter.pull_due() is None
    assert agent.reporter.pull(now=1000.0) is None
    assert portal.gets == []


@pytest.mark.parametrize("reply", [None, "5", 5.0, True, [5]])
def test_a_reply_without_an_integer_version_changes_nothing(portal, agent, reply):
    agent.reporter.note_portal_version(reply, now=100.0)

    assert agent.reporter.pull_due() is None


def test_after_a_pull_the_portal_version_it_issued_calls_for_no_other(portal, agent):
    """The pull makes the portal issue a new version; the node has exactly that one, so no loop."""
    serve(portal, agent, first_version=6)
    reporter = agent.reporter
    reporter.note_portal_version(5, now=100.0)
    reporter.pull(now=115.0)

    reporter.note_portal_version(6, now=125.0)  # the next heartbeat reply

    assert reporter.pull_due() is None
    assert len(portal.gets) == 1


def test_a_refused_but_authentic_pull_counts_as_seen_and_is_not_pulled_again(portal, agent):
    """A portal whose clock is 5 minutes ahead: everything it issues is refused, and reported; the
    agent must not pull it over and over."""
    versions = iter(range(6, 100))
    ahead = datetime.now(UTC) + timedelta(minutes=5)
    portal.body = lambda: json.dumps(agent.snapshot(next(versions), issued_at=ahead)).encode()
    reporter = agent.reporter
    reporter.note_portal_version(5, now=100.0)

    assert reporter.pull(now=115.0) == "refused"
    reporter.note_portal_version(6, now=125.0)

    assert reporter.pull_due() is None
    assert any("ahead of this node's clock" in message for message in agent.refusals())


def test_pulls_that_fail_back_off_and_one_that_works_resets_the_wait(portal, agent):
    reporter = agent.reporter
    reporter.note_portal_version(5, now=100.0)

    portal.status = 503
    assert reporter.pull(now=115.0) is None
    assert reporter.pull_due() == 115.0 + 2 * PULL_AFTER
    assert reporter.pull(now=145.0) is None
    assert reporter.pull_due() == 145.0 + 4 * PULL_AFTER

    # A snapshot this node cannot verify (the portal has a rotated secret) is no better.
    portal.status = 200
    portal.body = lambda: json.dumps(agent.snapshot(7, secret="rotated")).encode()
    assert reporter.pull(now=205.0) == "refused"
    assert reporter.pull_due() == 205.0 + 8 * PULL_AFTER

    serve(portal, agent, first_version=8)
    assert reporter.pull(now=325.0) == "applied"
    reporter.note_portal_version(9, now=330.0)  # a new booking, and its push lost again
    assert reporter.pull_due() == 330.0 + PULL_AFTER


def test_the_wait_between_failing_pulls_stops_growing_at_the_maximum(portal, agent):
    reporter = agent.reporter
    reporter.note_portal_version(5, now=0.0)
    portal.status = 503
    now, waits = PULL_AFTER, []
    for _ in range(8):
        reporter.pull(now=now)
        due = reporter.pull_due()
        waits.append(due - now)
        now = due

    assert waits == [30.0, 60.0, 120.0, 240.0, 480.0, MAX_PULL_INTERVAL, MAX_PULL_INTERVAL, MAX_PULL_INTERVAL]
    assert len(portal.gets) == 8


def test_a_forged_push_with_a_huge_version_does_not_silence_the_pull(portal, agent):
    serve(portal, agent, first_version=6)
    agent.enforcer.offer(agent.snapshot(10**15, secret="forged"))

    agent.reporter.note_portal_version(5, now=100.0)

    assert agent.reporter.pull_due() == 100.0 + PULL_AFTER
    assert agent.reporter.pull(now=115.0) == "applied"


def test_a_pulled_body_past_the_size_limit_is_refused_and_reported_unread(portal, agent):
    agent.enforcer.offer(agent.snapshot(4))
    portal.body = lambda: b"[" + b" " * (MAX_SNAPSHOT_BYTES + 1024) + b"]"
    agent.reporter.note_portal_version(5, now=100.0)

    assert agent.reporter.pull(now=115.0) == "refused"

    assert agent.refusals() == [f"larger than {MAX_SNAPSHOT_BYTES} bytes: not read"]
    assert agent.enforcer.applied_version == 4


@pytest.mark.parametrize("body", [b"", b"<html>proxy error</html>", b'{"node": ' + b"[" * 10_000])
def test_a_pulled_body_that_is_no_snapshot_is_a_reported_refusal(portal, agent, body):
    agent.enforcer.offer(agent.snapshot(4))
    portal.body = lambda: body
    agent.reporter.note_portal_version(5, now=100.0)

    assert agent.reporter.pull(now=115.0) == "refused"

    assert len(agent.refusals()) == 1
    assert agent.enforcer.applied_version == 4


def test_a_body_cut_off_on_the_way_is_never_applied(portal, agent):
    snapshot = json.dumps(agent.snapshot(6)).encode()
    portal.body = lambda: snapshot[: len(snapshot) // 2]
    portal.cut_short = True  # Content-Length says more than arrives
    agent.reporter.note_portal_version(5, now=100.0)

    assert agent.reporter.pull(now=115.0) in (None, "refused")

    assert agent.enforcer.applied_version == 0
    assert agent.reporter.pull_due() == 115.0 + 2 * PULL_AFTER
