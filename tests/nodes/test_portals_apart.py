"""Two portals on one Redis keep apart. Node broker users are Redis ACL users, which belong to a whole server, not
to a database: before prefixes, a second portal (staging, or a test run beside the demo) with a node of the same
name replaced the first's user, whose agent then could not log in until the first's sync put it back. Now each
portal's users carry a prefix of its own (NODE_BROKER_USER_PREFIX, nodes/broker_users.py) and its sync touches
nothing outside what its nodes name and its prefix.

Here a second portal runs as processes of its own (its own SQLite database, its default prefix) beside this one
(the test run's prefix), on one redis-server of the test's own; and another portal's users on the shared test
Redis, the server a running demo or another run uses, stay as they were while this run makes, rotates, removes and
syncs users of its own there."""

# Tests run fixed argument lists (never a shell).
# ruff: noqa: S603

from __future__ import annotations

import hashlib
import json
import os
import secrets
import subprocess
import sys
from io import StringIO
from pathlib import Path

import redis
from django.core.management import call_command

from kernel.redis_client import redis_client
from nodes.broker_users import acl_rules, broker_username, broker_users_forget, broker_users_sync
from nodes.models import Node
from tests.conftest import TEST_BROKER_USER_PREFIX
from tests.nodes.broker_redis import AclRedis, use_for_portal

REPO = Path(__file__).resolve().parents[2]

# The other portal: migrate its own database, register two nodes, print their configs (as register_node does).
OTHER_PORTAL_SETUP = """
import json, django
django.setup()
from django.core.management import call_command
from nodes.services import node_register
call_command("migrate", "--noinput", verbosity=0)
print(json.dumps({name: node_register(name=name, hostname=name + ".lab").broker_url for name in ("gpu-a", "gpu-b")}))
"""


def other_portal_environment(server: AclRedis, var_dir: Path) -> dict[str, str]:
    """A portal as a lab runs one: its own database (SQLite under its own VAR_DIR) and its own prefix (none set:
    the one derived from its address and database), per-node users on, its nodes' broker ``server``."""
    ours = {"DATABASE_URL", "NODE_BROKER_USER_PREFIX", "NODE_BROKER_USERS", "CELERY_BROKER_URL", "CACHE_URL"}
    environment = {key: value for key, value in os.environ.items() if key not in ours}
    environment.update(
        DJANGO_SETTINGS_MODULE="portal.settings",
        VAR_DIR=str(var_dir),
        NODE_BROKER_USERS="true",
        NODE_BROKER_URL=server.url,
        AGENT_BROKER_URL=server.url,
        # Its own tasks and cache in a database of that server apart from the nodes' queues.
        REDIS_URL=f"redis://:{server.portal_password}@127.0.0.1:{server.port}/5",
    )
    return environment


def run_other_portal(environment: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [sys.executable, *args], cwd=REPO, env=environment, capture_output=True, text=True, timeout=180, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def register(*args: str) -> str:
    """register_node here (this test run's portal); the BROKER_URL it prints."""
    out = StringIO()
    call_command("register_node", *args, stdout=out)
    return next(line.split("=", 1)[1] for line in out.getvalue().splitlines() if line.startswith("BROKER_URL="))


def username_of(url: str) -> str:
    return str(redis.connection.parse_url(url)["username"])


def as_node(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, socket_timeout=5)


def users(server: redis.Redis, names: list[str]) -> dict[str, object]:
    return {name: server.acl_getuser(name) for name in names}


def test_two_portals_on_one_redis_leave_each_others_node_users_alone(
    settings, db, tmp_path, django_capture_on_commit_callbacks
):
    server = AclRedis()
    try:
        other = other_portal_environment(server, tmp_path)
        theirs = json.loads(run_other_portal(other, "-c", OTHER_PORTAL_SETUP).splitlines()[-1])
        their_users = [username_of(url) for url in theirs.values()]
        # Its default prefix, from its own address and database: neither this run's nor a name from before prefixes.
        assert all(name.startswith("gpubook-") and "." in name for name in their_users)
        assert not any(name.startswith(TEST_BROKER_USER_PREFIX) for name in their_users)
        admin = server.admin()
        before = users(admin, their_users)
        their_login = as_node(theirs["gpu-a"])  # their agent, logged in all along
        assert their_login.ping()

        with use_for_portal(settings, server):
            # This portal: the same node names, made, given new credentials, one deleted, and a sync.
            ours = {name: register(name) for name in ("gpu-a", "gpu-b", "gpu-c")}
            ours["gpu-a"] = register("gpu-a", "--rotate")
            with django_capture_on_commit_callbacks(execute=True):
                Node.objects.filter(name="gpu-c").delete()
                broker_users_forget([broker_username("gpu-c")])
            del ours["gpu-c"]
            # A leftover of this portal's own (a removal that failed): the sync's to remove, and only it.
            admin.execute_command(
                "ACL", "SETUSER", broker_username("gpu-z"), *acl_rules(node_name="gpu-z", password_sha256="ab" * 32)
            )
            result = broker_users_sync()
            assert (result.repaired, result.removed) == ([], [broker_username("gpu-z")])

            assert users(admin, their_users) == before  # every field: password, keys, commands
            assert their_login.ping()  # never thrown out by this portal's rotation
            assert all(as_node(url).ping() for url in theirs.values())

            our_users = [username_of(url) for url in ours.values()]
            ours_before = users(admin, our_users)
            # And the other way round: the other portal's sync finds its own as they should be, and touches ours not.
            synced = run_other_portal(other, "manage.py", "sync_broker_users")
            assert synced.strip() == "broker users of 2 node(s), all as they should be"
            assert users(admin, our_users) == ours_before
            assert all(as_node(url).ping() for url in ours.values())
            assert broker_users_sync().repaired == []
    finally:
        server.stop()


def sha256(password: str) -> str:
    return hashlib.sha256(password.encode()).hexdigest()


def test_a_portals_users_on_the_shared_test_redis_stay_as_they_were_while_this_run_makes_its_own(
    settings, db, django_capture_on_commit_callbacks
):
    """The shared test Redis (REDIS_URL) is the server a demo beside the suite, or another run, keeps its users on.
    A portal's there, named for the same node as this run's, one under a prefix and one from before prefixes, keep
    every field and their open login through everything this run does with its own users on that server."""
    shared = redis_client()
    node = f"beside-{secrets.token_hex(4)}"  # no node name a real portal has
    password = secrets.token_urlsafe(16)
    theirs = [f"gpubook-beside-{secrets.token_hex(4)}.{node}", f"node-{node}"]
    for name in theirs:
        shared.execute_command("ACL", "SETUSER", name, *acl_rules(node_name=node, password_sha256=sha256(password)))
    ours = broker_username(node)
    try:
        before = users(shared, theirs)
        host = shared.connection_pool.connection_kwargs
        their_login = redis.Redis(
            host=host["host"], port=host["port"], username=theirs[0], password=password, socket_timeout=5
        )
        assert their_login.ping()
        settings.NODE_BROKER_USERS = True
        settings.NODE_BROKER_URL = settings.AGENT_BROKER_URL = settings.REDIS_URL

        register(node)
        url = register(node, "--rotate")
        assert username_of(url) == ours and as_node(url).ping()
        with django_capture_on_commit_callbacks(execute=True):
            Node.objects.filter(name=node).delete()
            broker_users_forget([ours])
        register(node)
        shared.execute_command("ACL", "SETUSER", ours, "nopass", "+@all")  # widened: the sync puts it back
        assert broker_users_sync().repaired == [node]

        assert users(shared, theirs) == before
        assert their_login.ping()
    finally:
        shared.execute_command("ACL", "DELUSER", *theirs, ours)
