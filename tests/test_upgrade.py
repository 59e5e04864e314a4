"""An upgrade keeps a lab's data: a database made and filled by the last release's own code is migrated by this
tree's ``migrate`` and served by this tree's portal as it was.

The release's tree comes out of git (``git archive``), its ``migrate`` makes a fresh database and
tests/upgrade_seed.py fills it through the release's own services: users, a node registered with its agent's
credentials and its broker user (made by the release, on a redis-server of the test's own), GPUs, a booking, a
recurring series, an API token. Then this tree migrates it, and a portal process of this tree answers the token
with the booking and the series as they were, answers the node's agent with a snapshot its lease secret verifies,
and keeps the node's broker user (named as the release named it) working.

CI clones main and may leave tags behind, so the release is also known here by its commit; a clone without either
(a shallow one) fails with the command that fetches it."""

# Tests run fixed argument lists (never a shell), git and tar from the PATH.
# ruff: noqa: S603, S607

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
import redis
import requests
from django.db import connection

from gpubook_agent import protocol
from gpubook_agent.snapshot import MAX_SNAPSHOT_BYTES, check_fresh, decode_snapshot, parse_snapshot
from tests.agent.portal_client import agent_client
from tests.databases import scratch_database
from tests.live.server import AsgiServer
from tests.nodes.broker_redis import AclRedis

pytestmark = [
    pytest.mark.postgres_only,
    pytest.mark.skipif(connection.vendor != "postgresql", reason="the release's database is made on PostgreSQL"),
]

ROOT = Path(__file__).resolve().parent.parent
SEED = Path(__file__).resolve().parent / "upgrade_seed.py"

# The release a lab upgrades from: its tag, and the commit the tag names (docs/operations.md, "Upgrades").
RELEASE = ("v2.0.0", "1a87128140b0a2240635a0b41a952b29230fa44e")


def git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)


def release_ref() -> str:
    """The release's tag if this clone has it (and it names the commit above), else its commit; a clear failure
    when neither is here."""
    tag, commit = RELEASE
    if git("rev-parse", "--git-dir").returncode != 0:
        pytest.fail(f"this tree is no git clone: the upgrade test needs release {tag}'s tree from git")
    tagged = git("rev-parse", "--verify", "--quiet", f"refs/tags/{tag}^{{commit}}")
    if tagged.returncode == 0:
        assert tagged.stdout.strip() == commit, f"tag {tag} names {tagged.stdout.strip()}, RELEASE says {commit}"
        return tag
    if git("cat-file", "-e", f"{commit}^{{commit}}").returncode == 0:
        return commit
    pytest.fail(
        f"neither the tag {tag} nor its commit {commit[:12]} is in this clone's history (a shallow clone, or tags "
        "not fetched): run `git fetch --unshallow --tags` (or `git fetch origin tag " + tag + "`) and run it again"
    )


def extract(ref: str, into: Path) -> None:
    archive = subprocess.Popen(["git", "archive", "--format=tar", ref], cwd=ROOT, stdout=subprocess.PIPE)
    unpacked = subprocess.run(["tar", "-x", "-C", str(into)], stdin=archive.stdout, capture_output=True, check=False)
    assert archive.wait(timeout=120) == 0 and unpacked.returncode == 0, unpacked.stderr


def run(command: list[str], *, cwd: Path, env: dict[str, str], timeout: int = 300) -> str:
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    assert done.returncode == 0, f"{' '.join(command[-2:])} in {cwd}:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return done.stdout + done.stderr


def test_a_database_the_last_release_made_and_filled_is_intact_after_this_trees_migrate(tmp_path):
    release = tmp_path / "release"
    release.mkdir()
    extract(release_ref(), release)
    broker = AclRedis()  # the nodes' broker, on which the release made the node's user
    try:
        with scratch_database() as database:
            environment = {
                **os.environ,
                "DJANGO_SETTINGS_MODULE": "portal.settings",
                "DATABASE_URL": database,
                "VAR_DIR": str(tmp_path / "var"),
                # The portal's own tasks and cache there too, apart from the nodes' queues.
                "REDIS_URL": f"redis://:{broker.portal_password}@127.0.0.1:{broker.port}/5",
                "NODE_BROKER_URL": broker.url,
                "AGENT_BROKER_URL": broker.url,
                "NODE_BROKER_USERS": "true",
            }
            # The release's code only: its tree (and its agent package) before this tree's installed one.
            before = {**environment, "PYTHONPATH": f"{release}{os.pathsep}{release / 'agent'}"}
            seeded = json.loads(run([sys.executable, str(SEED)], cwd=release, env=before).strip().splitlines()[-1])

            migrated = run([sys.executable, "manage.py", "migrate", "--noinput"], cwd=ROOT, env=environment)
            assert "Traceback" not in migrated
            _check_served(seeded, database)
            # The node's broker user, named as the release named it, is this tree's to keep: found as it should be,
            # the agent's BROKER_URL from the release still logs in, and the admins are told to move it to a prefix.
            synced = run([sys.executable, "manage.py", "sync_broker_users"], cwd=ROOT, env=environment)
            assert synced.strip() == "broker users of 1 node(s), all as they should be"
            assert redis.Redis.from_url(seeded["broker_url"], socket_timeout=5).ping()
            checked = run([sys.executable, "manage.py", "check", "--database", "default"], cwd=ROOT, env=environment)
            assert "nodes.W005" in checked and seeded["node"] in checked
    finally:
        broker.stop()


def _check_served(seeded: dict, database: str) -> None:
    """This tree's portal, on the upgraded database: the token, the booking, the series, the node's snapshot."""
    portal = AsgiServer(DATABASE_URL=database)
    portal.start()
    try:
        api = {"Authorization": f"Bearer {seeded['token']}"}
        booking = seeded["booking"]
        answer = requests.get(f"{portal.url}/api/v1/reservations/{booking['id']}/", headers=api, timeout=30)
        assert answer.status_code == 200, answer.text
        shown = answer.json()
        assert (shown["status"], shown["purpose"], shown["user"], shown["node"]) == (
            booking["status"],
            "up",
            "alice",
            seeded["node"],
        )
        assert _instant(shown["start"]) == _instant(booking["start"]) and _instant(shown["end"]) == _instant(
            booking["end"]
        )
        assert [gpu["uuid"] for gpu in shown["gpus"]] == seeded["gpus"][:1]
        series = seeded["series"]
        assert len(series["bookings"]) == 3
        for pk in series["bookings"]:
            occurrence = requests.get(f"{portal.url}/api/v1/reservations/{pk}/", headers=api, timeout=30).json()
            assert occurrence["series"] == series["id"] and occurrence["gpus"][0]["uuid"] == seeded["gpus"][1]

        agent = agent_client(portal.url, seeded["node"], seeded["lease_secret"], seeded["agent_token"])
        body = agent.fetch(protocol.SNAPSHOT, limit=MAX_SNAPSHOT_BYTES)
    finally:
        portal.stop()
    snapshot = parse_snapshot(decode_snapshot(body), node_name=seeded["node"], secret=seeded["lease_secret"])
    check_fresh(snapshot, now=datetime.now(UTC), max_age_seconds=60)
    leased = {(lease.reservation, lease.user, lease.gpus) for lease in snapshot.leases}
    assert (booking["id"], "alice", tuple(seeded["gpus"][:1])) in leased


def _instant(value: str) -> datetime:
    return datetime.fromisoformat(value)
