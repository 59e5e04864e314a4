"""Holders that try to keep a GPU past their slot, against a real agent process, real ACLs and throwaway users:
one the agent may not signal (a set-user-ID root program holding the device open) and one that reached the device
through another name (a bind mount in a user namespace of its own)."""

# Tests run fixed argument lists (never a shell) of tools and interpreters found on this machine.
# ruff: noqa: S603

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from datetime import timedelta

import pytest

from tests.agent.conftest import CHILD_ENV, SETUID_HOLDER, UnixUser, run_as, start_ready
from tests.agent.harness import acl_users, lease, now, wait_for

# Inside `unshare -Urm` (a user and mount namespace of the user's own): the device bound onto a file of theirs, and
# opened under that name. /proc/<pid>/fd then shows the other name.
ALIAS_HOLDER = """
import subprocess, sys, time
device, alias = sys.argv[1], sys.argv[2]
subprocess.run(["mount", "--bind", device, alias], check=True)
held = open(alias, "r+b", buffering=0)
print("ready", flush=True)
time.sleep(600)
"""


def test_a_holder_with_roots_privileges_is_one_incident_that_drains_its_gpu_until_it_is_gone(
    make_agent, portal, unix_users, started
):
    alice, bob, _ = unix_users
    agent = make_agent(grace_seconds=1)
    end = now() + timedelta(seconds=2)
    agent.send(agent.snapshot([lease(1, alice.name, [agent.uuid(0)], now(), end)]))
    assert wait_for(lambda: alice.name in acl_users(agent.device(0)), timeout=10)
    holder = start_ready(
        [sys.executable, "-I", "-c", SETUID_HOLDER, str(alice.uid), str(alice.gid), agent.device(0)],
        started,
        cwd="/",
        env=CHILD_ENV,
    )

    assert wait_for(lambda: portal.events("unkillable"), timeout=20)
    (incident,) = portal.events("unkillable")
    assert (incident["gpu"], incident["user"], incident["pid"], incident["process"]) == (
        agent.uuid(0),
        alice.name,
        holder.pid,
        "su",
    )
    assert incident["drained"] is True and "root's privileges" in incident["message"]
    assert holder.poll() is None  # never signalled: it runs as root
    assert wait_for(lambda: agent.uuid(0) in portal.received["heartbeat"][-1]["drained"], timeout=5)

    # A booking that starts on the drained GPU is held back: nobody new shares a GPU with that process.
    agent.send(agent.snapshot([lease(2, bob.name, [agent.uuid(0)], now(), now() + timedelta(hours=1))]))
    assert wait_for(lambda: _refusals(portal, 2), timeout=10)
    assert "is drained" in _refusals(portal, 2)[0]["message"]
    assert bob.name not in acl_users(agent.device(0))

    # Several reconciles later (one a second here): still one incident, and the log said it once.
    heartbeats = len(portal.received["heartbeat"])
    assert wait_for(lambda: len(portal.received["heartbeat"]) >= heartbeats + 3, timeout=15)
    assert len(portal.events("unkillable")) == 1
    assert sum("refused to signal" in line for line in agent.log) <= 1

    holder.kill()  # an admin ends it
    holder.wait(timeout=10)
    assert wait_for(lambda: portal.events("drain_cleared"), timeout=10)
    assert portal.events("drain_cleared")[0]["gpu"] == agent.uuid(0)
    assert wait_for(lambda: bob.name in acl_users(agent.device(0)), timeout=10)  # and bob's slot opens


def _refusals(portal, reservation: int) -> list[dict]:
    return [event for event in portal.events("lease_refused") if event.get("reservation") == reservation]


@pytest.fixture
def own_directory(unix_users) -> Iterator[str]:
    """A directory of alice's own, with a file in it she may bind the device onto."""
    directory = tempfile.mkdtemp(prefix="gpbt-alias-", dir="/tmp")
    try:
        os.chmod(directory, 0o755)  # noqa: S103 - the agent and the test must read it
        os.chown(directory, unix_users[0].uid, unix_users[0].gid)
        alias = os.path.join(directory, "my-gpu")
        with open(alias, "wb"):
            pass
        os.chown(alias, unix_users[0].uid, unix_users[0].gid)
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _user_namespaces_work(user: UnixUser) -> bool:
    unshare = shutil.which("unshare")
    if unshare is None:
        return False
    result = subprocess.run([unshare, "-Urm", "true"], **run_as(user), capture_output=True, check=False)
    return result.returncode == 0


def test_a_holder_that_opened_the_gpu_through_a_bind_mount_is_ended_at_the_slots_end(
    make_agent, portal, unix_users, user_python, own_directory, started
):
    alice, bob, _ = unix_users
    if not _user_namespaces_work(alice):
        pytest.skip("unprivileged user namespaces are off on this machine")
    agent = make_agent(grace_seconds=1)
    end = now() + timedelta(seconds=3)
    agent.send(
        agent.snapshot(
            [
                lease(1, alice.name, [agent.uuid(0)], now(), end),
                lease(2, bob.name, [agent.uuid(1)], now(), now() + timedelta(hours=1)),
            ]
        )
    )
    assert wait_for(lambda: alice.name in acl_users(agent.device(0)), timeout=10)
    alias = os.path.join(own_directory, "my-gpu")
    holder = start_ready(
        [shutil.which("unshare"), "-Urm", user_python, "-I", "-c", ALIAS_HOLDER, agent.device(0), alias],
        started,
        **run_as(alice),
    )
    # unshare runs the holder in its own place (no fork): its pid is the holder's.
    opened = {os.readlink(f"/proc/{holder.pid}/fd/{fd}") for fd in os.listdir(f"/proc/{holder.pid}/fd")}
    assert alias in opened and agent.device(0) not in opened  # what the agent sees is the other name

    assert wait_for(lambda: holder.poll() is not None, timeout=20)
    assert now() - end >= timedelta(seconds=1)  # not before the grace period is over
    assert holder.returncode == -15
    assert wait_for(lambda: portal.events("leftover"), timeout=5)  # the reporter sends events as they come
    (leftover,) = portal.events("leftover")
    assert (leftover["gpu"], leftover["user"], leftover["pids"]) == (agent.uuid(0), alice.name, [holder.pid])
    assert wait_for(lambda: portal.events("ended"), timeout=5)
    assert not portal.events("violation")  # a leftover of a revoked holder, not use without a booking
    assert acl_users(agent.device(1)) == {bob.name}  # bob's card is untouched


def test_a_slices_holder_on_its_cards_device_file_alone_keeps_the_slice_drained_until_it_is_gone(
    make_agent, portal, unix_users, started
):
    alice = unix_users[0]
    agent = make_agent(grace_seconds=1, simulated_mig="0:3g.40gb,2g.20gb,2g.20gb")
    assert wait_for(lambda: portal.received["heartbeat"], timeout=10)
    (card,) = portal.received["heartbeat"][0]["mig"]
    piece = card["slices"][0]["uuid"]
    agent.send(agent.snapshot([lease(1, alice.name, [piece], now(), now() + timedelta(seconds=2))]))
    assert wait_for(lambda: alice.name in acl_users(agent.device(0)), timeout=10)
    holder = start_ready(  # the card's device file only, which every slice of the card shares
        [sys.executable, "-I", "-c", SETUID_HOLDER, str(alice.uid), str(alice.gid), agent.device(0)],
        started,
        cwd="/",
        env=CHILD_ENV,
    )

    assert wait_for(lambda: portal.events("unkillable"), timeout=20)
    assert portal.events("unkillable")[0]["gpu"] == piece
    heartbeats = len(portal.received["heartbeat"])
    assert wait_for(lambda: len(portal.received["heartbeat"]) >= heartbeats + 3, timeout=15)
    assert not portal.events("drain_cleared")  # still held: still drained
    assert piece in portal.received["heartbeat"][-1]["drained"]

    holder.kill()
    holder.wait(timeout=10)
    assert wait_for(lambda: portal.events("drain_cleared"), timeout=10)
