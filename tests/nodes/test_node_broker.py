"""The nodes' broker (NODE_BROKER_URL) apart from the portal's Redis: snapshots go there, the portal's own tasks
stay on CELERY_BROKER_URL, the nodes' users live there, and a broker that is full or away fails a push within
seconds, logged, with the booking kept. Each test runs a redis-server of its own for the nodes (tests/nodes/
broker_redis.py); the portal's Redis is the shared test Redis."""

# Tests run fixed argument lists (never a shell).
# ruff: noqa: S603

from __future__ import annotations

import logging
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from io import StringIO

import pytest
import redis
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone
from rest_framework.test import APIClient

from gpubook_agent import protocol
from kernel.redis_client import redis_client
from nodes.broker_users import broker_username
from nodes.checks import check_node_broker_is_its_own
from nodes.models import Node
from nodes.node_broker import NodeBrokerError, redis_server
from nodes.services import node_rotate_credentials
from reservations import pushes
from reservations.pushes import push_all_leases, push_node_leases, request_push
from reservations.services import reservation_create
from tests.agent.harness import free_port, wait_for
from tests.conftest import at
from tests.factories import node_with_gpus
from tests.nodes.broker_redis import AclRedis, Filled
from tests.nodes.queues import messages, purge

NODE = "gpu-nb"
QUEUE = f"node.{NODE}"
PUSH_TASK = "nodes.push_node_leases"


@pytest.fixture
def node_broker(settings) -> Iterator[AclRedis]:
    """A nodes' broker of its own, with room for 20 clients; the portal's tasks stay on the shared Redis."""
    server = AclRedis("--maxclients", "20")
    settings.NODE_BROKER_URL = settings.AGENT_BROKER_URL = server.url
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def agent_node(db) -> Iterator[Node]:
    node = node_with_gpus(2, name=NODE)
    node_rotate_credentials(node=node)  # an agent was registered: it has a token (broker users are off here)
    purge("celery", QUEUE, pushes.PENDING_KEY.format(node_id=node.pk))
    yield node
    purge("celery", QUEUE, pushes.PENDING_KEY.format(node_id=node.pk))


def queued(server: AclRedis) -> int:
    return server.admin().llen(QUEUE)


def test_the_push_task_stays_on_the_portals_broker_and_the_snapshot_goes_to_the_nodes(
    node_broker, agent_node, django_capture_on_commit_callbacks
):
    request_push(agent_node.pk)
    assert [m["task"] for m in messages("celery")] == [PUSH_TASK]  # the portal's worker runs it
    assert node_broker.admin().llen("celery") == 0

    version = push_node_leases(agent_node.pk)

    assert version is not None and queued(node_broker) == 1
    assert messages(QUEUE) == []  # nothing for the nodes on the portal's own Redis
    agent_node.refresh_from_db()
    assert agent_node.lease_version == version


def test_a_full_nodes_broker_fails_the_push_logged_and_the_node_is_told_to_pull(
    node_broker, agent_node, caplog, settings
):
    before = agent_node.lease_version
    filled = Filled(node_broker.port, username="default", password=node_broker.portal_password)
    try:
        assert filled.full
        with caplog.at_level(logging.WARNING, logger="reservations.pushes"):
            assert push_node_leases(agent_node.pk) is None
    finally:
        filled.release()

    # (The reason is Redis' "max number of clients reached", or the reset it closed with before redis-py read it.)
    assert f"could not push the leases of node {NODE} (its agent pulls them): the nodes' broker at" in caplog.text
    assert node_broker.portal_password not in caplog.text
    agent_node.refresh_from_db()
    assert agent_node.lease_version > before  # what the next heartbeat reply says: the node pulls
    assert queued(node_broker) == 0
    # Room again (once Redis has seen the connections go): pushes resume.
    assert wait_for(lambda: push_node_leases(agent_node.pk) is not None, timeout=10)
    assert queued(node_broker) == 1


def test_a_stopped_nodes_broker_fails_no_booking_and_the_node_pulls_what_the_push_missed(
    node_broker, agent_node, alice, settings, clock, caplog, django_capture_on_commit_callbacks
):
    """The nodes' broker killed (docs/operations.md, "When a dependency is away"): a booking is made as ever, its
    push fails in seconds and is logged, the node's next heartbeat reply says it is behind, and its pull brings the
    booking; once the broker is back, pushes resume."""
    agent = APIClient()
    agent.credentials(HTTP_AUTHORIZATION=f"Bearer {node_rotate_credentials(node=agent_node).agent_token}")
    node_broker.stop()

    with django_capture_on_commit_callbacks(execute=True):
        booking = reservation_create(user=alice, gpus=[agent_node.gpus.first()], start=at(0.25), end=at(2))
    with caplog.at_level(logging.WARNING, logger="reservations.pushes"):
        assert push_node_leases(agent_node.pk) is None  # what the worker does with the booking's push
    assert f"could not push the leases of node {NODE} (its agent pulls them)" in caplog.text

    agent_node.refresh_from_db()
    heartbeat = protocol.heartbeat(
        backend="simulated", driver_version=None, applied_version=0, acls={}, sent_at=timezone.now()
    )
    reply = agent.post("/api/v1/agent/heartbeat/", heartbeat, format="json")
    assert reply.status_code == 200 and reply.json()["lease_version"] == agent_node.lease_version
    pulled = agent.get("/api/v1/agent/snapshot/").json()
    assert [lease["reservation"] for lease in pulled["leases"]] == [booking.pk]

    node_broker.restart()
    assert wait_for(lambda: push_node_leases(agent_node.pk) is not None, timeout=10)
    assert queued(node_broker) == 1


def test_a_nodes_broker_that_is_away_stops_the_full_round_at_the_first_node(agent_node, settings, caplog):
    other = node_with_gpus(1, name="gpu-nb-2")
    node_rotate_credentials(node=other)
    settings.NODE_BROKER_URL = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    versions = dict(Node.objects.values_list("name", "lease_version"))

    with pytest.raises(NodeBrokerError, match=r"took no message for node\.gpu-nb:"):
        push_all_leases()

    after = dict(Node.objects.values_list("name", "lease_version"))
    assert after[NODE] > versions[NODE] and after["gpu-nb-2"] == versions["gpu-nb-2"]  # the round ended there
    assert "pushed 0 of 2 nodes' leases" in caplog.text


def test_a_booking_needs_no_nodes_broker(agent_node, alice, settings, clock, django_capture_on_commit_callbacks):
    settings.NODE_BROKER_URL = f"redis://127.0.0.1:{free_port()}/0"
    gpu = agent_node.gpus.order_by("index").first()
    with django_capture_on_commit_callbacks(execute=True):
        booking = reservation_create(user=alice, gpus=[gpu], start=at(1), end=at(2))

    assert booking.pk and [m["task"] for m in messages("celery", task=PUSH_TASK)] == [PUSH_TASK]
    assert push_node_leases(agent_node.pk) is None  # the worker's push, refused: logged, not raised


def test_the_nodes_users_are_made_on_the_nodes_broker_not_the_portals_redis(node_broker, db, settings):
    settings.NODE_BROKER_USERS = True
    out = StringIO()
    call_command("register_node", NODE, stdout=out)
    config = dict(line.split("=", 1) for line in out.getvalue().splitlines() if "=" in line and "#" not in line[:1])

    assert config["BROKER_URL"].startswith(f"redis://{broker_username(NODE)}:")
    assert config["BROKER_URL"].endswith(f"@127.0.0.1:{node_broker.port}/3")
    assert node_broker.admin().acl_getuser(broker_username(NODE)) is not None
    assert redis_client().acl_getuser(broker_username(NODE)) is None
    assert redis.Redis.from_url(config["BROKER_URL"], socket_timeout=5).ping()


def test_registering_while_the_nodes_broker_is_full_changes_nothing(node_broker, db, settings):
    settings.NODE_BROKER_USERS = True
    filled = Filled(node_broker.port, username="default", password=node_broker.portal_password)
    try:
        with pytest.raises(
            CommandError, match=r"nothing changed: cannot reach the broker at redis://:\*\*@127\.0\.0\.1"
        ):
            call_command("register_node", NODE, stdout=StringIO())
    finally:
        filled.release()
    assert not Node.objects.filter(name=NODE).exists()


def test_the_portal_starts_whatever_the_nodes_broker_says(node_broker, db, settings):
    """docker-compose's web runs sync_broker_users --warn-only before it serves: a nodes' broker a node has filled
    up must not keep the portal down (beat syncs again every minute)."""
    settings.NODE_BROKER_USERS = True
    call_command("register_node", NODE, stdout=StringIO())
    filled = Filled(node_broker.port, username="default", password=node_broker.portal_password)
    try:
        err = StringIO()
        call_command("sync_broker_users", "--warn-only", stdout=StringIO(), stderr=err)
        assert "not synced (beat tries again): cannot reach the broker" in err.getvalue()
        with pytest.raises(CommandError, match="cannot reach the broker"):
            call_command("sync_broker_users", stdout=StringIO())
    finally:
        filled.release()


# -- where the nodes' broker is, by default, and the deployment check ---------------------------------------------


def test_the_nodes_broker_defaults_to_the_portals_and_the_agents_url_to_the_nodes_broker():
    script = (
        "import django, json; django.setup(); from django.conf import settings as s; "
        "print(json.dumps([s.CELERY_BROKER_URL, s.NODE_BROKER_URL, s.AGENT_BROKER_URL]))"
    )
    ours = ("REDIS_URL", "CELERY_BROKER_URL", "NODE_BROKER_URL", "AGENT_BROKER_URL")
    base = {key: value for key, value in os.environ.items() if key not in ours}
    base.update(DJANGO_SETTINGS_MODULE="portal.settings", VAR_DIR=tempfile.mkdtemp())
    cases = [
        ({"REDIS_URL": "redis://r:6379/1"}, ["redis://r:6379/1"] * 3),
        (
            {"REDIS_URL": "redis://r:6379/1", "NODE_BROKER_URL": "redis://n:6379/0"},
            ["redis://r:6379/1", "redis://n:6379/0", "redis://n:6379/0"],
        ),
        (
            {"NODE_BROKER_URL": "redis://n:6379/0", "AGENT_BROKER_URL": "redis://nodes.example.org:6379/0"},
            ["redis://127.0.0.1:6379/0", "redis://n:6379/0", "redis://nodes.example.org:6379/0"],
        ),
    ]
    for environment, expected in cases:
        done = subprocess.run(
            [sys.executable, "-c", script], env={**base, **environment}, capture_output=True, text=True, check=False
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip().splitlines()[-1] == str(expected).replace("'", '"'), environment


@pytest.mark.parametrize(
    ("url", "server"),
    [
        ("redis://:pw@127.0.0.1:6379/0", ("tcp", "loopback:6379")),
        ("redis://localhost/3", ("tcp", "loopback:6379")),
        ("rediss://user:pw@Redis.Example.org:6380/0?ssl_cert_reqs=required", ("tcp", "redis.example.org:6380")),
        ("unix:///run/redis/redis.sock?db=2", ("unix", "/run/redis/redis.sock")),
        ("amqp://guest@rabbit:5672//", None),
    ],
)
def test_which_redis_server_a_url_names(url, server):
    assert redis_server(url) == server


def _portal_on(settings, url: str) -> None:
    settings.REDIS_URL = settings.CELERY_BROKER_URL = settings.CHANNEL_LAYER_URL = url
    settings.CACHES = {"default": {**settings.CACHES["default"], "LOCATION": url}}


def test_check_deploy_warns_when_the_nodes_share_the_portals_redis(settings):
    settings.DEBUG, settings.NODE_BROKER_SHARED = False, False
    _portal_on(settings, "redis://:secret@redis.lab:6379/0")

    settings.NODE_BROKER_URL = "redis://:secret@redis.lab:6379/5"  # another database: the same server's clients
    (warning,) = check_node_broker_is_its_own()
    assert warning.id == "nodes.W004"
    assert "REDIS_URL, CELERY_BROKER_URL, CHANNEL_LAYER_URL, CACHE_URL" in warning.msg
    assert "secret" not in warning.msg and "NODE_BROKER_SHARED=true" in warning.hint

    settings.CHANNEL_LAYER_URL = "redis://channels.lab:6379/0"
    settings.NODE_BROKER_URL = "redis://channels.lab:6379/1"
    (warning,) = check_node_broker_is_its_own()
    assert "is the Redis server of CHANNEL_LAYER_URL:" in warning.msg

    settings.NODE_BROKER_URL = "redis://:other@node-broker.lab:6379/0"
    assert check_node_broker_is_its_own() == []


def test_the_check_is_quiet_under_debug_or_where_the_lab_accepts_one_redis(settings):
    _portal_on(settings, "redis://127.0.0.1:6379/0")
    settings.NODE_BROKER_URL = "redis://localhost:6379/0"
    settings.DEBUG, settings.NODE_BROKER_SHARED = False, False
    assert [m.id for m in check_node_broker_is_its_own()] == ["nodes.W004"]

    settings.DEBUG = True
    assert check_node_broker_is_its_own() == []
    settings.DEBUG, settings.NODE_BROKER_SHARED = False, True
    assert check_node_broker_is_its_own() == []
