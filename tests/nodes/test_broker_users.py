"""A broker credential per node, against a real redis-server with ACLs (a private one: ACL users belong to a
whole server) and the real agent: one node's credential opens nothing of another's, its own agent still
gets its snapshots through Celery, a rotation ends the old password's sessions, and the users come back
after Redis restarts."""

# Tests run fixed argument lists (never a shell).
# ruff: noqa: S603

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
import redis
from django.core.checks import Error, Warning
from django.core.management import call_command
from django.core.management.base import CommandError
from kombu import Connection

from nodes.broker_users import (
    BrokerUserError,
    SyncResult,
    acl_rules,
    agent_broker_url,
    broker_username,
    broker_users_sync,
    default_user_prefix,
    own_node_name,
    prefix_for,
    user_prefix,
)
from nodes.checks import check_broker_server, check_broker_user_settings
from nodes.models import Node
from nodes.services import node_rotate_credentials
from reservations.pushes import send_snapshot
from tests.agent.harness import AgentRun, RecordingPortal, wait_for
from tests.conftest import TEST_BROKER_USER_PREFIX
from tests.factories import node_with_gpus
from tests.nodes.broker_redis import AclRedis, use_for_portal

REPO = Path(__file__).resolve().parents[2]
USER_A = f"{TEST_BROKER_USER_PREFIX}gpu-a"  # gpu-a's broker user: this test run's prefix, then the node's name


@pytest.fixture
def broker(settings) -> Iterator[AclRedis]:
    """The portal and its nodes on a redis-server of this test's own, per-node users on."""
    server = AclRedis()
    try:
        with use_for_portal(settings, server):
            yield server
    finally:
        server.stop()


@pytest.fixture
def portal() -> Iterator[RecordingPortal]:
    recording = RecordingPortal()
    yield recording
    recording.stop()


def register(*args: str) -> dict[str, str]:
    out = StringIO()
    call_command("register_node", *args, stdout=out)
    return dict(line.split("=", 1) for line in out.getvalue().splitlines() if "=" in line and not line.startswith("#"))


def as_node(url: str) -> redis.Redis:
    """A plain Redis client logged in with a node's BROKER_URL, as someone holding its agent.conf would be."""
    return redis.Redis.from_url(url, socket_timeout=5)


def refused(client: redis.Redis, *command: Any) -> bool:
    try:
        client.execute_command(*command)
    except redis.exceptions.NoPermissionError:
        return True
    return False


def denied_log(server: AclRedis, username: str) -> list[dict[str, Any]]:
    """What Redis refused ``username`` (its ACL LOG: commands, keys, failed logins)."""
    return [entry for entry in server.admin().acl_log() if entry["username"] == username]


# -- what register_node prints and keeps ----------------------------------------------------------------


def test_registering_prints_a_broker_url_with_the_nodes_own_user_and_keeps_only_a_hash(broker, db):
    config = register("gpu-a", "--hostname", "a.lab")

    node = Node.objects.get(name="gpu-a")
    url = redis.connection.parse_url(config["BROKER_URL"])
    assert config["BROKER_URL"].startswith(f"redis://{USER_A}:{url['password']}@127.0.0.1:{broker.port}/3")
    assert url["username"] == USER_A and url["password"] != broker.portal_password
    assert node.broker_password_hash == hashlib.sha256(url["password"].encode()).hexdigest()
    stored = [str(value) for value in Node.objects.filter(pk=node.pk).values().get().values()]
    assert not any(url["password"] in value for value in stored)
    assert as_node(config["BROKER_URL"]).ping()
    user = broker.admin().acl_getuser(USER_A)
    assert user["passwords"] == [node.broker_password_hash]


def test_the_nodes_url_keeps_the_brokers_address_and_tls_options(settings):
    settings.AGENT_BROKER_URL = (
        "rediss://:portal@redis.example.org:6380/2?ssl_cert_reqs=required&ssl_ca_certs=/etc/ca.pem"
    )
    assert agent_broker_url(username="lab.gpu-a", password="s3cret") == (
        "rediss://lab.gpu-a:s3cret@redis.example.org:6380/2?ssl_cert_reqs=required&ssl_ca_certs=/etc/ca.pem"
    )
    assert agent_broker_url(username="lab.gpu-a", password=None) == settings.AGENT_BROKER_URL


def test_the_grant_names_one_exact_key_and_select_only_outside_database_0(settings):
    settings.AGENT_BROKER_URL = "redis://127.0.0.1:6379/0"
    assert acl_rules(node_name="gpu-a", password_sha256="ab" * 32) == [
        *("reset", "on", "#" + "ab" * 32, "~node.gpu-a", "resetchannels", "-@all", "+ping", "+brpop"),
    ]
    settings.AGENT_BROKER_URL = "redis://127.0.0.1:6379/3"
    assert acl_rules(node_name="gpu-a", password_sha256="ab" * 32)[-1] == "+select"


# -- one node's credential opens nothing of another's ----------------------------------------------------

OTHER = "node.gpu-b"
NEIGHBOUR = "node.gpu-a-2"  # what a pattern node.gpu-a* would have let in
MINE = "node.gpu-a"

FORBIDDEN = {
    "read B's queue": [("LRANGE", OTHER, 0, -1), ("LLEN", OTHER), ("LINDEX", OTHER, 0), ("TYPE", OTHER)],
    "read B's queue another way": [("EXISTS", OTHER), ("DUMP", OTHER), ("LPOS", OTHER, "x"), ("SORT", OTHER)],
    "pop B's queue": [("RPOP", OTHER), ("LPOP", OTHER), ("BRPOP", OTHER, 1), ("BLPOP", OTHER, 1)],
    "move B's messages to A": [("RPOPLPUSH", OTHER, MINE), ("LMOVE", OTHER, MINE, "RIGHT", "LEFT")],
    "pop B's queue beside A's own": [("BRPOP", MINE, OTHER, 1)],
    "delete B's queue": [("DEL", OTHER), ("UNLINK", OTHER), ("LTRIM", OTHER, 1, 0), ("EXPIRE", OTHER, 1)],
    "delete B's queue another way": [("RENAME", OTHER, "x"), ("LREM", OTHER, 0, "x"), ("LSET", OTHER, 0, "x")],
    "take a neighbour's queue": [("BRPOP", NEIGHBOUR, 1), ("LRANGE", NEIGHBOUR, 0, -1), ("DEL", NEIGHBOUR)],
    "use the portal's celery queue": [("LRANGE", "celery", 0, -1), ("BRPOP", "celery", 1), ("LPUSH", "celery", "x")],
    "use kombu's shared keys": [
        ("HGETALL", "unacked"), ("ZRANGE", "unacked_index", 0, -1), ("SMEMBERS", "_kombu.binding.celery")
    ],
    "fill its own queue": [("LPUSH", MINE, "junk"), ("RPUSH", MINE, "junk")],
    "publish to the websocket layer": [("PUBLISH", "gpubook3.live", "x"), ("PUBSUB", "CHANNELS")],
    "wipe or reconfigure Redis": [
        ("FLUSHALL",), ("FLUSHDB",), ("CONFIG", "GET", "*"), ("CONFIG", "SET", "maxmemory", "1")
    ],
    "widen its own rights": [
        ("ACL", "SETUSER", USER_A, "+@all", "~*"), ("ACL", "LIST"), ("ACL", "GETUSER", "default")
    ],
    "look around or run code": [("KEYS", "*"), ("SCAN", 0), ("EVAL", "return 1", 0), ("CLIENT", "LIST"), ("INFO",)],
    "stop Redis or throw the portal out": [
        ("SHUTDOWN", "NOSAVE"), ("CLIENT", "KILL", "USER", "default"), ("REPLICAOF", "127.0.0.1", 1), ("SAVE",)
    ],
}  # fmt: skip


@pytest.mark.parametrize("attempt", FORBIDDEN, ids=list(FORBIDDEN))
def test_one_nodes_credential_is_refused(broker, db, attempt):
    a = register("gpu-a")
    register("gpu-b")
    register("gpu-a-2")
    portal = broker.admin()
    for queue in (OTHER, NEIGHBOUR, "celery"):
        portal.lpush(queue, "a snapshot nobody else may see")
    node_a = as_node(a["BROKER_URL"])

    for command in FORBIDDEN[attempt]:
        assert refused(node_a, *command), command

    assert [portal.llen(queue) for queue in (OTHER, NEIGHBOUR, "celery")] == [1, 1, 1]
    assert portal.llen(MINE) == 0 and portal.ping()


def test_another_database_holds_nothing_for_it_either(broker, db):
    a = register("gpu-a")
    broker.admin(database=0).lpush(OTHER, "x")
    node_a = as_node(a["BROKER_URL"])
    assert node_a.execute_command("SELECT", 0)  # +select: needed for database 3, and it lets any number through
    assert refused(node_a, "LRANGE", OTHER, 0, -1) and refused(node_a, "DEL", OTHER)
    assert broker.admin(database=0).llen(OTHER) == 1


def test_in_database_0_it_may_not_even_select(settings, db):
    server = AclRedis(database=0)
    try:
        with use_for_portal(settings, server):
            node_a = as_node(register("gpu-a")["BROKER_URL"])
            assert node_a.ping()
            assert refused(node_a, "SELECT", 1)
    finally:
        server.stop()


# -- its own agent still works, with exactly that grant ---------------------------------------------------


def start_agent(config: dict[str, str], portal: RecordingPortal) -> AgentRun:
    if os.geteuid() != 0:
        pytest.skip("the agent runs as root (ACLs, other users' processes)")
    agent = AgentRun(
        broker_url=config["BROKER_URL"],
        portal_url=portal.url,
        node_name=config["NODE_NAME"],
        secret=config["LEASE_SECRET"],
        token=config["AGENT_TOKEN"],
    )
    agent.start()
    return agent


def received(agent: AgentRun, version: int, timeout: float = 15) -> bool:
    def stored() -> bool:
        snapshot = agent.stored_snapshot()
        return snapshot is not None and snapshot.get("version") == version

    return wait_for(stored, timeout=timeout) is not None


def test_the_agent_gets_the_portals_pushes_with_its_own_user_and_never_hits_a_refusal(broker, db, portal):
    node = node_with_gpus(2, name="gpu-a")
    config = _config_of(node_rotate_credentials(node=node))
    agent = start_agent(config, portal)
    try:
        for _ in range(3):
            version = send_snapshot(node)  # the portal's own push, through the portal's Celery app
            assert received(agent, version), "\n".join(agent.log[-30:])
        agent.stop()  # a clean stop: nothing is handed back, nothing else is touched
    finally:
        agent.cleanup()

    assert denied_log(broker, USER_A) == []  # not one command or key beyond the grant, start to stop
    assert broker.admin().keys("unacked*") == []
    assert broker.admin().llen(MINE) == 0


def test_over_tls_too(settings, db, portal, tmp_path):
    server = AclRedis(tls_dir=tmp_path)
    try:
        with use_for_portal(settings, server):
            node = node_with_gpus(1, name="gpu-a")
            config = _config_of(node_rotate_credentials(node=node))
            assert config["BROKER_URL"].startswith(f"rediss://{USER_A}:")
            assert "ssl_cert_reqs=required&ssl_ca_certs=" in config["BROKER_URL"]
            agent = start_agent(config, portal)
            try:
                assert received(agent, send_snapshot(node)), "\n".join(agent.log[-30:])
            finally:
                agent.cleanup()
    finally:
        server.stop()


# -- rotation ----------------------------------------------------------------------------------------------


def test_rotation_ends_the_old_password_even_on_an_open_connection(broker, db, portal):
    node = node_with_gpus(1, name="gpu-a")
    old = _config_of(node_rotate_credentials(node=node))
    agent = start_agent(old, portal)
    try:
        opened = redis.Connection(**_connection_kwargs(old["BROKER_URL"]))
        opened.connect()
        opened.send_command("PING")
        assert opened.read_response() in (b"PONG", "PONG")
        assert received(agent, send_snapshot(node))

        new = _config_of(node_rotate_credentials(node=node))

        with pytest.raises(redis.ConnectionError):  # Redis closed it: no command goes through on the old login
            opened.send_command("PING")
            opened.read_response()
        with pytest.raises(redis.AuthenticationError):
            as_node(old["BROKER_URL"]).ping()
        # The running agent, on the old password, was thrown out too and cannot log in again...
        assert wait_for(lambda: any(e["reason"] == "auth" for e in denied_log(broker, USER_A)), 20) is not None
        version = send_snapshot(node)
        assert broker.admin().llen(MINE) == 1  # ...so the push waits for the agent with the new config
        agent.stop()
        agent.cleanup()

        agent = start_agent(new, portal)
        assert received(agent, version)
        assert as_node(new["BROKER_URL"]).ping()
    finally:
        agent.cleanup()


def test_a_broker_that_refuses_changes_nothing(broker, db, client, carol):
    register("gpu-a")
    node = Node.objects.get(name="gpu-a")
    before = (node.lease_secret, node.agent_token_hash, node.broker_password_hash)
    # The portal's Redis user loses the right to manage users (a hand-made user, or a managed Redis).
    broker.admin().execute_command("ACL", "SETUSER", "default", "-acl")

    with pytest.raises(CommandError, match=r"nothing changed: .*NOPERM.*\+acl \+client\|kill.*NODE_BROKER_USERS=false"):
        register("gpu-a", "--rotate")
    with pytest.raises(CommandError, match="NOPERM"):
        register("gpu-new")
    client.force_login(carol)
    response = client.post(
        "/admin/nodes/node/", {"action": "issue_agent_credentials", "_selected_action": [node.pk]}, follow=True
    )

    node.refresh_from_db()
    assert (node.lease_secret, node.agent_token_hash, node.broker_password_hash) == before
    assert not Node.objects.filter(name="gpu-new").exists()
    assert "LEASE_SECRET=" not in response.content.decode()
    assert "Node gpu-a: nothing changed: the broker at redis://:**@127.0.0.1" in response.content.decode()
    assert broker.portal_password not in response.content.decode()


def test_a_portal_user_that_may_set_users_but_not_end_sessions_changes_neither(broker, db):
    old = register("gpu-a")
    broker.admin().execute_command("ACL", "SETUSER", "default", "-client|kill")

    with pytest.raises(CommandError, match="NOPERM"):
        register("gpu-a", "--rotate")

    assert as_node(old["BROKER_URL"]).ping()  # the password Redis holds is still the one the node has


def test_a_redis_without_acls_is_named_with_the_way_out(settings, db):
    server = AclRedis("--rename-command", "ACL", "")  # as a Redis older than 6 answers
    try:
        with use_for_portal(settings, server):
            with pytest.raises(CommandError, match=r"has no ACL users .*NODE_BROKER_USERS=false"):
                register("gpu-a")
            assert [message.id for message in check_broker_server(databases=["default"])] == ["nodes.E002"]
    finally:
        server.stop()


def test_with_broker_users_off_every_node_gets_the_portals_url_and_redis_is_not_touched(broker, db, settings):
    settings.NODE_BROKER_USERS = False
    config = register("gpu-a")
    assert config["BROKER_URL"] == broker.url
    assert Node.objects.get(name="gpu-a").broker_password_hash == ""
    assert broker.admin().acl_getuser(USER_A) is None


def test_rotating_after_broker_users_were_switched_off_removes_the_old_user(broker, db, settings):
    old = register("gpu-a")
    opened = as_node(old["BROKER_URL"])
    assert opened.ping()
    settings.NODE_BROKER_USERS = False

    new = register("gpu-a", "--rotate")

    assert new["BROKER_URL"] == broker.url
    assert broker.admin().acl_getuser(USER_A) is None
    with pytest.raises((redis.ConnectionError, redis.AuthenticationError)):  # the open login went with the user
        opened.ping()
    with pytest.raises((redis.AuthenticationError, redis.ResponseError)):
        as_node(old["BROKER_URL"]).ping()


# -- after Redis restarts -------------------------------------------------------------------------------------


def test_the_users_come_back_after_a_redis_restart(broker, db, portal):
    node = node_with_gpus(1, name="gpu-a")
    config = _config_of(node_rotate_credentials(node=node))
    register("gpu-b")
    agent = start_agent(config, portal)
    try:
        assert received(agent, send_snapshot(node))

        broker.restart()
        with pytest.raises(redis.AuthenticationError):
            as_node(config["BROKER_URL"]).ping()  # gone with the restart
        out = StringIO()
        call_command("sync_broker_users", stdout=out)

        assert out.getvalue().strip() == "broker users of 2 node(s): re-created gpu-a, gpu-b"
        assert as_node(config["BROKER_URL"]).ping()  # the same password as before: the agent needs no new config
        assert received(agent, send_snapshot(node), timeout=40)  # the agent reconnects by itself
        assert refused(as_node(config["BROKER_URL"]), "FLUSHALL")
    finally:
        agent.cleanup()
    assert broker_users_sync().repaired == []  # idempotent: nothing more to do


def test_a_portal_user_that_may_not_list_users_still_gets_every_user_back_after_a_restart(broker, db):
    """A portal's Redis user allowed what registration needs but not ACL USERS (a hand-made user, a managed Redis):
    the sync still re-creates every node's user, and only leaves its prefix's leftovers, with a warning; the
    checks that migrate runs warn (nodes.W006), so docker-compose's `migrate && ...` still starts the portal."""
    a, b = register("gpu-a")["BROKER_URL"], register("gpu-b")["BROKER_URL"]
    broker.restart()
    leftover = f"{TEST_BROKER_USER_PREFIX}gpu-z"  # a deleted node's user whose removal failed
    broker.admin().execute_command("ACL", "SETUSER", leftover, *acl_rules(node_name="gpu-z", password_sha256="ab" * 32))
    broker.admin().execute_command("ACL", "SETUSER", "default", "-acl|users")
    assert refused(broker.admin(), "ACL", "USERS")

    out, err = StringIO(), StringIO()
    call_command("sync_broker_users", stdout=out, stderr=err)

    assert out.getvalue().strip() == "broker users of 2 node(s): re-created gpu-a, gpu-b"
    assert "were not looked for" in err.getvalue() and "+acl|users" in err.getvalue()
    assert broker.portal_password not in err.getvalue()
    assert as_node(a).ping() and as_node(b).ping()
    assert broker.admin().acl_getuser(leftover) is not None  # left: it could not be found
    assert broker_users_sync().repaired == []
    messages = check_broker_server(databases=["default"])
    assert [(type(m), m.id) for m in messages] == [(Warning, "nodes.W006")]
    assert "acl users" in messages[0].msg and "+acl|users" in messages[0].hint
    call_command("migrate", "--noinput", skip_checks=False, verbosity=0)  # its checks warn, and it goes on

    broker.admin().execute_command("ACL", "SETUSER", "default", "+acl|users")
    assert broker_users_sync().removed == [leftover]
    assert check_broker_server(databases=["default"]) == []


def test_a_widened_user_is_put_back(broker, db):
    url = register("gpu-a")["BROKER_URL"]
    broker.admin().execute_command("ACL", "SETUSER", USER_A, "+@all", "~*", "allchannels")
    assert not refused(as_node(url), "KEYS", "*")

    assert broker_users_sync().repaired == ["gpu-a"]
    assert refused(as_node(url), "KEYS", "*") and as_node(url).ping()


def test_deleting_a_node_in_admin_removes_its_user(broker, db, client, carol, django_capture_on_commit_callbacks):
    url = register("gpu-a")["BROKER_URL"]
    node = Node.objects.get(name="gpu-a")
    client.force_login(carol)
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(f"/admin/nodes/node/{node.pk}/delete/", {"post": "yes"})
    assert response.status_code == 302
    assert broker.admin().acl_getuser(broker_username("gpu-a")) is None
    with pytest.raises(redis.AuthenticationError):
        as_node(url).ping()


# -- system checks ----------------------------------------------------------------------------------------------


def test_checks_name_a_default_user_without_password_and_nodes_on_the_portals_credential(settings, db):
    server = AclRedis()
    try:
        with use_for_portal(settings, server):
            assert check_broker_server(databases=["default"]) == []
            node_with_gpus(1, name="old-node", agent_token_hash="x" * 64)  # registered before broker users
            server.admin().execute_command("ACL", "SETUSER", "default", "nopass")

            messages = check_broker_server(databases=["default"])
    finally:
        server.stop()
    assert [(type(m), m.id) for m in messages] == [(Warning, "nodes.W002"), (Warning, "nodes.W003")]
    assert "old-node" in messages[1].msg


def test_checks_name_a_portal_user_that_may_not_manage_users(broker, db):
    broker.admin().execute_command("ACL", "SETUSER", "default", "-client|kill")
    (message,) = check_broker_server(databases=["default"])
    assert (type(message), message.id) == (Error, "nodes.E003")
    assert "client kill" in message.msg and "NODE_BROKER_USERS=false" in message.hint
    broker.admin().execute_command("ACL", "SETUSER", "default", "+client|kill", "-acl|users")
    assert [(type(m), m.id) for m in check_broker_server(databases=["default"])] == [(Warning, "nodes.W006")]


def test_checks_warn_when_the_broker_does_not_answer(broker, db):
    broker.stop()
    assert [m.id for m in check_broker_server(databases=["default"])] == ["nodes.W001"]
    with pytest.raises(CommandError, match="cannot reach the broker"):
        register("gpu-a")


def test_broker_users_need_a_redis_broker(settings):
    settings.NODE_BROKER_USERS = True
    settings.NODE_BROKER_URL = settings.AGENT_BROKER_URL = "amqp://portal:secret@rabbit.example.org:5672//"
    (message,) = check_broker_user_settings()
    assert message.id == "nodes.E001" and "NODE_BROKER_USERS=false" in message.msg
    assert "secret" not in message.msg
    with pytest.raises(BrokerUserError, match="needs a Redis broker"):
        broker_users_sync()
    settings.NODE_BROKER_USERS = False
    assert check_broker_user_settings() == []


def test_broker_users_are_on_unless_a_lab_opts_out():
    environ = {key: value for key, value in os.environ.items() if key != "NODE_BROKER_USERS"}
    script = "from django.conf import settings; import django; django.setup(); print(settings.NODE_BROKER_USERS)"
    for value, expected in ((None, "True"), ("false", "False")):
        env = {**environ, "DJANGO_SETTINGS_MODULE": "portal.settings", "VAR_DIR": tempfile.mkdtemp()}
        if value is not None:
            env["NODE_BROKER_USERS"] = value
        result = subprocess.run([sys.executable, "-c", script], env=env, cwd=REPO, capture_output=True, text=True)
        assert result.stdout.strip() == expected, result.stderr


# -- the demo -------------------------------------------------------------------------------------------------


@pytest.fixture
def demo_device_root() -> Iterator[str]:
    """Where demo_agents may put stand-in device files: a folder others may traverse, never the real /var/tmp."""
    parent = tempfile.mkdtemp(prefix="gpbt-demo-", dir="/tmp")
    os.chmod(parent, 0o755)  # noqa: S103 - demo_agents refuses a root the demo users cannot reach
    yield os.path.join(parent, "gpubook-demo")
    shutil.rmtree(parent)


def test_demo_configs_carry_the_nodes_own_user_and_are_rewritten_when_it_changes(
    broker, db, tmp_path, demo_device_root
):
    node = node_with_gpus(2, name="gpu-a")
    options = ("--dir", str(tmp_path), "--device-root", demo_device_root)
    call_command("demo_agents", *options, stdout=StringIO())
    first = (tmp_path / "gpu-a.conf").read_text()
    assert f"BROKER_URL=redis://{USER_A}:" in first
    out = StringIO()
    call_command("demo_agents", *options, stdout=out)
    assert "(kept)" in out.getvalue()

    Node.objects.filter(pk=node.pk).update(broker_password_hash="0" * 64)  # a broker password no longer valid
    out = StringIO()
    call_command("demo_agents", *options, stdout=out)
    assert "(kept)" not in out.getvalue()
    assert (tmp_path / "gpu-a.conf").read_text() != first


def test_kombu_reads_the_printed_url_as_the_nodes_user(broker, db):
    url = register("gpu-a")["BROKER_URL"]
    with Connection(url, transport_options={"ack_emulation": False, "priority_steps": [0]}) as connection:
        connection.ensure_connection(max_retries=1)
        assert connection.info()["userid"] == USER_A


# -- each portal its own prefix; users made before prefixes ----------------------------------------------------


def test_the_sync_removes_only_its_own_prefixs_users_that_no_node_has(broker, db):
    register("gpu-a")
    rules = acl_rules(node_name="gpu-b", password_sha256="ab" * 32)
    leftover = f"{TEST_BROKER_USER_PREFIX}gpu-b"  # ours: a deleted node's user whose removal failed
    others = [
        "gpubook-0f0f0f0f.gpu-b",  # another portal's
        "node-gpu-b",  # a name from before prefixes that no node of ours has: perhaps another portal's
        f"{TEST_BROKER_USER_PREFIX}gpu-b.x",  # not a node's name under our prefix
        f"{TEST_BROKER_USER_PREFIX[:-1]}-x.gpu-b",  # a prefix that starts like ours
    ]
    for username in (leftover, *others):
        broker.admin().execute_command("ACL", "SETUSER", username, *rules)

    result = broker_users_sync()

    assert (result.repaired, result.removed) == ([], [leftover])
    assert broker.admin().acl_getuser(leftover) is None
    assert all(broker.admin().acl_getuser(username) for username in others)
    assert broker.admin().acl_getuser(USER_A)["passwords"] == [Node.objects.get(name="gpu-a").broker_password_hash]


def test_a_user_named_before_prefixes_keeps_working_until_its_node_gets_new_credentials(broker, db):
    """A portal upgraded from before prefixes: the node's row names its user node-gpu-a (migration nodes/0018), as
    its agent's BROKER_URL does. It keeps working, comes back after Redis restarts, is warned about, and moves to
    this portal's prefix with the next credentials, the old login ended."""
    password = "s3cret-from-before-prefixes"
    node = node_with_gpus(1, name="gpu-a", agent_token_hash="x" * 64)
    Node.objects.filter(pk=node.pk).update(broker_password_hash=_sha256(password), broker_username="node-gpu-a")
    old_url = agent_broker_url(username="node-gpu-a", password=password)
    assert broker_users_sync().repaired == ["gpu-a"]  # made, as after a Redis restart
    opened = as_node(old_url)
    assert opened.ping()
    (warning,) = [m for m in check_broker_server(databases=["default"]) if m.id == "nodes.W005"]
    assert "gpu-a" in warning.msg and f"{TEST_BROKER_USER_PREFIX}<name>" in warning.hint

    new = register("gpu-a", "--rotate")

    assert redis.connection.parse_url(new["BROKER_URL"])["username"] == USER_A and as_node(new["BROKER_URL"]).ping()
    assert broker.admin().acl_getuser("node-gpu-a") is None
    with pytest.raises((redis.ConnectionError, redis.AuthenticationError)):  # its open login went with it
        opened.ping()
    assert Node.objects.get(pk=node.pk).broker_username == USER_A
    assert [m.id for m in check_broker_server(databases=["default"])] == []
    assert broker_users_sync() == SyncResult(checked=1)


def test_the_default_prefix_is_the_portals_address_database_and_key_and_names_never_meet(settings):
    postgres = {"ENGINE": "django.db.backends.postgresql", "HOST": "db", "PORT": 5432, "NAME": "portal"}
    key = "k" * 50
    production = prefix_for(portal_url="https://gpus.example.org", database=postgres, secret_key=key)
    assert re.fullmatch(r"gpubook-[0-9a-f]{8}\.", production)
    same = prefix_for(portal_url="https://gpus.example.org/", database=dict(postgres), secret_key=key)
    assert same == production  # stable
    # Staging restored from production's dump: the same key, another address or database.
    assert prefix_for(portal_url="https://staging.gpus.example.org", database=postgres, secret_key=key) != production
    staging_database = {**postgres, "NAME": "staging"}
    assert prefix_for(portal_url="https://gpus.example.org", database=staging_database, secret_key=key) != production
    sqlite = {"ENGINE": "django.db.backends.sqlite3", "NAME": "/srv/a/var/portal.sqlite3"}
    assert prefix_for(portal_url="http://127.0.0.1:8000", database=sqlite, secret_key=key) != prefix_for(
        portal_url="http://127.0.0.1:8000", database={**sqlite, "NAME": "/srv/b/var/portal.sqlite3"}, secret_key=key
    )
    # Two docker-compose stacks left at the defaults on one Redis: only the SECRET_KEY each generated differs.
    compose = {"ENGINE": "django.db.backends.postgresql", "HOST": "postgres", "PORT": 5432, "NAME": "portal"}
    assert prefix_for(portal_url="http://localhost:8000", database=compose, secret_key="a" * 50) != prefix_for(
        portal_url="http://localhost:8000", database=compose, secret_key="b" * 50
    )
    settings.NODE_BROKER_USER_PREFIX = ""
    assert (
        user_prefix()
        == default_user_prefix()
        == prefix_for(
            portal_url=settings.PORTAL_URL, database=settings.DATABASES["default"], secret_key=settings.SECRET_KEY
        )
    )
    # One portal's names are never another's, nor taken for one: the prefix ends with the name's one '.'.
    assert own_node_name(f"{production}gpu-a", production) == "gpu-a"
    assert own_node_name(f"{production}gpu-a", "gpubook-.") is None
    assert own_node_name("node-gpu-a", production) is None


@pytest.mark.parametrize("prefix", ["gpubook-staging", "two.dots.", "spa ce.", "x" * 41 + "."])
def test_a_prefix_redis_names_could_not_keep_apart_is_refused_at_start(settings, prefix):
    settings.NODE_BROKER_USERS = True
    settings.NODE_BROKER_USER_PREFIX = prefix
    (message,) = check_broker_user_settings()
    assert message.id == "nodes.E001" and "NODE_BROKER_USER_PREFIX" in message.msg
    settings.NODE_BROKER_USER_PREFIX = "gpubook-staging."
    assert check_broker_user_settings() == []


# -- helpers ------------------------------------------------------------------------------------------------


def _config_of(credentials: Any) -> dict[str, str]:
    return dict(line.split("=", 1) for line in credentials.as_config().splitlines())


def _sha256(password: str) -> str:
    return hashlib.sha256(password.encode()).hexdigest()


def _connection_kwargs(url: str) -> dict[str, Any]:
    parsed = redis.connection.parse_url(url)
    return {**parsed, "socket_timeout": 5}
