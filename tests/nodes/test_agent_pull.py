"""The pull, the portal's side: GET /api/v1/agent/snapshot/ gives a node its own signed snapshot,
issued fresh, with a version the next heartbeat reply shows as the portal's (so one pull is enough)."""

from __future__ import annotations

import pytest
from django.core.cache import cache
from django.utils import timezone
from rest_framework.test import APIClient

from gpubook_agent import protocol
from gpubook_agent.signing import verify
from gpubook_agent.snapshot import parse_snapshot
from nodes.agent_auth import AgentRateThrottle
from nodes.models import Node
from nodes.services import node_rotate_credentials
from reservations.pushes import send_snapshot
from reservations.services import reservation_create
from tests.api_helpers import client_for
from tests.conftest import at
from tests.factories import node_with_gpus
from tests.nodes.queues import purge

pytestmark = pytest.mark.usefixtures("clock")

SNAPSHOT = "/api/v1/agent/snapshot/"
HEARTBEAT = "/api/v1/agent/heartbeat/"


def agent_client(node: Node) -> tuple[APIClient, str]:
    """A client with the node's token, and the node's lease secret."""
    credentials = node_rotate_credentials(node=node)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {credentials.agent_token}")
    return client, credentials.lease_secret


def heartbeat_body(applied_version: int) -> protocol.Heartbeat:
    return protocol.heartbeat(
        backend="simulated", driver_version=None, applied_version=applied_version, acls={}, sent_at=timezone.now()
    )


@pytest.fixture
def other_node(db):
    return node_with_gpus(2, name="gpu-4090")


def test_a_node_pulls_its_own_signed_snapshot_issued_now(node, gpus, other_node, alice, bob):
    reservation_create(user=alice, gpus=gpus[:2], start=at(0.25), end=at(2))
    reservation_create(user=bob, gpus=list(other_node.gpus.all()[:1]), start=at(0.25), end=at(2))
    client, secret = agent_client(node)

    response = client.get(SNAPSHOT)

    assert response.status_code == 200, response.content
    assert response["Cache-Control"] == "no-store"
    snapshot = response.json()
    assert verify(snapshot, secret)
    # The agent's own parser takes it as it is, with the node's name and secret.
    parsed = parse_snapshot(snapshot, node_name="gpu-a100", secret=secret)
    assert parsed.issued_at == timezone.now()
    assert [(lease.user, len(lease.gpus)) for lease in parsed.leases] == [("alice", 2)]  # not bob's, elsewhere


def test_each_pull_issues_a_new_version_and_the_heartbeat_then_shows_the_node_level(node, gpus):
    client, _ = agent_client(node)
    first = client.get(SNAPSHOT).json()["version"]
    second = client.get(SNAPSHOT).json()["version"]

    assert second > first
    node.refresh_from_db()
    assert node.lease_version == second
    # The agent that applied it is level with the portal: its next heartbeat calls for no other pull.
    reply = client.post(HEARTBEAT, heartbeat_body(applied_version=second), format="json").json()
    assert reply["lease_version"] == second


def test_a_pull_is_newer_than_a_push_it_follows(node, gpus):
    """The push the pull stands in for was lost; if it turns up later it is older, and stale."""
    purge("node.gpu-a100")
    client, _ = agent_client(node)
    pushed = send_snapshot(node)
    purge("node.gpu-a100")  # the push is lost

    pulled = client.get(SNAPSHOT).json()["version"]

    assert pulled > pushed


def test_only_a_node_token_gets_a_snapshot(node, alice, carol):
    assert APIClient().get(SNAPSHOT).status_code == 401
    for person in (alice, carol):
        refused = client_for(person).get(SNAPSHOT)
        assert refused.status_code == 401
        assert "node agent token" in refused.json()["error"]["message"]
    old, _ = agent_client(node)
    agent_client(node)  # new credentials: the old token opens nothing
    assert old.get(SNAPSHOT).status_code == 401


def test_the_snapshot_is_throttled_with_the_other_agent_endpoints(node, monkeypatch):
    monkeypatch.setattr(AgentRateThrottle, "THROTTLE_RATES", {"agent": "2/minute"})
    # The frozen clock puts every test in one minute, and SQLite gives each test's node the same id.
    cache.delete(AgentRateThrottle.cache_format % {"scope": "agent", "ident": f"node-{node.pk}"})
    client, _ = agent_client(node)

    assert client.post(HEARTBEAT, heartbeat_body(0), format="json").status_code == 200
    assert client.get(SNAPSHOT).status_code == 200
    assert client.get(SNAPSHOT).status_code == 429  # one budget per node for all its endpoints
