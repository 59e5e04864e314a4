"""Issue 36: one node's broker credential fills the nodes' broker, and the portal carries on.

Redis cannot cap one user's connections, so a node holding its agent.conf can open them until the server's
maxclients. Here the nodes' broker is a Redis of its own (NODE_BROKER_URL: a throwaway redis-server with a small
maxclients), the portal's tasks, cache, channel layer and telemetry queue stay on the portal's Redis; a real
portal (daphne, as scripts/run serves it), a real Celery worker and a real agent run, and one node's credential
fills the nodes' broker. The portal's pages, API, websockets and bookings still answer, the push of the new
booking fails and is logged, and the booking reaches the node by the agent's pull.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
import redis
import requests
from celery.contrib.testing.worker import start_worker
from django.db import connection
from django.utils import timezone

from accounts.services import api_token_create
from gpubook_agent.gpus.simulated import simulated_uuid
from nodes.broker_users import broker_username
from nodes.models import AgentState, Gpu, Node
from nodes.services import node_register
from portal.celery import app
from reservations.models import Allocation
from tests.agent.harness import AgentRun, acl_users, wait_for
from tests.factories import UserFactory
from tests.live.server import AsgiServer, open_client, session_for
from tests.nodes.broker_redis import AclRedis, Filled, clients_of
from tests.nodes.queues import purge

pytestmark = [
    pytest.mark.postgres_only,
    pytest.mark.skipif(connection.vendor != "postgresql", reason="the portal server shares the test database"),
    pytest.mark.django_db(transaction=True),
]

MAXCLIENTS = 20  # the nodes' broker's own, small so that one test fills it
NODE = "full-node"
PULL_AFTER = 3.0  # the agent's PULL_AFTER_SECONDS here


@dataclass
class Lab:
    broker: AclRedis
    portal: AsgiServer
    node: Node
    agent: AgentRun
    password: str  # the node's broker password, from the BROKER_URL register_node printed


@pytest.fixture
def lab(settings, unix_users) -> Iterator[Lab]:
    """A nodes' broker of its own, a real portal server and worker pointed at it, one registered node and its
    agent. The portal's own Redis is the shared test Redis (REDIS_URL), untouched by the nodes."""
    broker = AclRedis("--maxclients", str(MAXCLIENTS))
    portal: AsgiServer | None = None
    agent: AgentRun | None = None
    try:
        settings.NODE_BROKER_URL = settings.AGENT_BROKER_URL = broker.url
        settings.NODE_BROKER_USERS = True
        credentials = node_register(name=NODE, hostname="full.lab")  # its broker user, on the nodes' broker
        for index in range(2):
            Gpu.objects.create(
                node=credentials.node, index=index, uuid=simulated_uuid(NODE, index), model="Simulated", memory_mib=1
            )
        config = dict(line.split("=", 1) for line in credentials.as_config().splitlines())
        portal = AsgiServer(
            NODE_BROKER_URL=broker.url, AGENT_BROKER_URL=broker.url, NODE_BROKER_USERS="true", LIVE_RECHECK_SECONDS="1"
        )
        portal.start()
        purge("celery")
        agent = AgentRun(
            broker_url=config["BROKER_URL"],
            portal_url=portal.url,
            node_name=NODE,
            secret=credentials.lease_secret,
            token=credentials.agent_token,
            gpus=2,
            pull_after_seconds=PULL_AFTER,
        )
        agent.start()
        password = redis.connection.parse_url(config["BROKER_URL"])["password"]
        with start_worker(app, pool="solo", perform_ping_check=False, shutdown_timeout=10):
            yield Lab(broker, portal, credentials.node, agent, password)
    finally:
        if agent is not None:
            agent.cleanup()
        if portal is not None:
            portal.stop()
        broker.stop()
        purge("celery")


def test_a_node_filling_the_nodes_broker_leaves_the_portal_working_and_the_lease_arrives_by_pull(
    lab, unix_users, caplog, settings
):
    caplog.set_level(logging.WARNING, logger="reservations.pushes")
    person = unix_users[0]
    researcher = UserFactory(username="dana", unix_username=person.name)
    _, token = api_token_create(user=researcher, name="script")
    api = {"Authorization": f"Bearer {token}"}
    watcher = lab.broker.admin()  # opened before the broker fills up, to look at it afterwards
    watcher.ping()
    username = broker_username(NODE)
    assert wait_for(lambda: any(c["cmd"] == "brpop" for c in clients_of(watcher, username)), timeout=20), "\n".join(
        lab.agent.log[-30:]
    )
    # The connection budget docs/agent.md gives: one connection per agent, its consumer's.
    assert [client["cmd"] for client in clients_of(watcher, username)] == ["brpop"]

    filled = Filled(lab.broker.port, username=username, password=lab.password)
    try:
        assert filled.full, filled.refusal  # the node's own credential was enough to fill it
        with pytest.raises(redis.ConnectionError):  # the portal's own credential is turned away too
            redis.Redis.from_url(lab.broker.url, socket_timeout=5).ping()

        # The portal's pages, API and websockets answer.
        session = {settings.SESSION_COOKIE_NAME: session_for(researcher)}
        for page in ("/", "/status/", "/reservations/mine/"):
            response = requests.get(lab.portal.url + page, cookies=session, timeout=20, allow_redirects=False)
            assert response.status_code == 200, (page, response.status_code)
        nodes = requests.get(f"{lab.portal.url}/api/v1/nodes/", headers=api, timeout=20)
        assert nodes.status_code == 200 and NODE in nodes.text
        live = open_client(lab.portal, token=token)
        assert live.subscribe("calendar")[-1]["type"] == "subscribed"

        # A booking succeeds, and the websocket hears of it.
        start = timezone.now()
        booked = requests.post(
            f"{lab.portal.url}/api/v1/reservations/",
            json={
                "node": NODE,
                "gpu_count": 1,
                "start": start.isoformat(),
                "end": (start + timedelta(hours=1)).isoformat(),
            },
            headers=api,
            timeout=20,
        )
        assert booked.status_code == 201, booked.text
        booking: dict[str, Any] = booked.json()
        assert live.wait_for(lambda m: m["type"] == "calendar" and m.get("node") == NODE, timeout=20)
        live.close()

        # Its push is refused by the full broker, logged, and the agent pulls the booking instead.
        assert wait_for(lambda: f"could not push the leases of node {NODE}" in caplog.text, timeout=30), caplog.text
        gpu = Allocation.objects.get(reservation_id=booking["id"]).gpu
        granted = wait_for(lambda: person.name in acl_users(lab.agent.device(gpu.index)), timeout=PULL_AFTER + 30)
        assert granted is not None, "\n".join(lab.agent.log[-40:])
        assert any("pulling the snapshot" in line for line in lab.agent.log)
        leases = lab.agent.stored_snapshot()["leases"]
        assert [lease["reservation"] for lease in leases] == [booking["id"]]
        assert watcher.llen(f"node.{NODE}") == 0  # nothing came by the broker
        assert wait_for(
            lambda: AgentState.objects.filter(
                node=lab.node, applied_version__gte=lab.agent.stored_snapshot()["version"]
            ).exists(),
            timeout=20,
        )
    finally:
        filled.release()
