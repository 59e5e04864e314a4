"""The agent's state directory as a local user on the node would attack it, against the real agent
process (its start is what matters here): a state dir someone else can write, state files that are
symbolic links to files elsewhere, and a revocation log edited by hand. Real files, real ACLs, real
processes of real (throwaway) users.
"""

# Tests run fixed argument lists (never a shell).

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings

from gpubook_agent.signing import signed
from tests.agent.harness import AgentRun, RecordingPortal, acl_users, lease, now, wait_for

pytestmark = pytest.mark.usefixtures("unix_users")


@pytest.fixture
def new_agent(portal: RecordingPortal) -> Iterator[Callable[..., AgentRun]]:
    """An agent's files and config, not started yet (the test prepares its state dir first)."""
    runs: list[AgentRun] = []

    def make(**options: Any) -> AgentRun:
        options.setdefault("broker_url", settings.CELERY_BROKER_URL)
        options.setdefault("portal_url", portal.url)
        run = AgentRun(**options)
        runs.append(run)
        return run

    yield make
    for run in runs:
        run.cleanup()


def revocation_log(rows: list[list[str]], secret: str) -> dict[str, Any]:
    """A revocation log as the agent writes it (gpubook_agent/store.py)."""
    return signed({"kind": "revocation-log", "revocations": rows}, secret)


# -- a state dir someone else can write: the agent does not start ---------------------------------------


@pytest.mark.parametrize("owner", ["group-writable", "world-writable", "another account"])
def test_the_agent_refuses_to_start_with_a_state_dir_others_can_write(new_agent, portal, unix_users, owner):
    agent = new_agent()
    alice, mallory = unix_users[0], unix_users[2]
    agent.state_dir.mkdir(mode=0o700)
    # What such a directory could hold: a snapshot (validly signed here) giving alice a GPU.
    (agent.state_dir / "snapshot.json").write_text(
        json.dumps(agent.snapshot([lease(1, alice.name, [agent.uuid(0)], now(), now() + timedelta(hours=1))]))
    )
    if owner == "another account":
        os.chown(agent.state_dir, mallory.uid, mallory.gid)
        found = f"owned by {mallory.name} (uid {mallory.uid}) with mode 0700"
    else:
        bits = 0o770 if owner == "group-writable" else 0o1777
        agent.state_dir.chmod(bits)
        found = f"owned by root (uid 0) with mode {bits:04o}"

    result = agent.run_until_exit()

    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.startswith(f"gpubook-agent: STATE_DIR {agent.state_dir} is {found}: ")
    assert result.stderr.rstrip().endswith(f"fix: chown root: {agent.state_dir}; chmod 700 {agent.state_dir}")
    assert acl_users(agent.device(0)) == set()  # nothing granted
    assert portal.received == {"heartbeat": [], "events": [], "telemetry": []}


def test_after_the_fix_the_same_state_dir_is_used(new_agent, unix_users):
    """The control for the test above: the directory and snapshot were fine but for the mode."""
    agent = new_agent()
    alice = unix_users[0]
    agent.state_dir.mkdir(mode=0o700)
    (agent.state_dir / "snapshot.json").write_text(
        json.dumps(agent.snapshot([lease(1, alice.name, [agent.uuid(0)], now(), now() + timedelta(hours=1))]))
    )
    agent.state_dir.chmod(0o770)
    assert agent.run_until_exit().returncode == 2

    agent.state_dir.chmod(0o700)  # the fix it printed
    agent.start()

    assert wait_for(lambda: alice.name in acl_users(agent.device(0)), timeout=5)


# -- state files that are links --------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["symlink", "regular file"])
def test_a_symlinked_stored_snapshot_is_not_followed_and_a_new_one_replaces_the_link(
    new_agent, portal, unix_users, kind
):
    agent = new_agent()
    alice = unix_users[0]
    elsewhere = agent.home / "elsewhere.json"
    planted = agent.snapshot([lease(1, alice.name, [agent.uuid(0)], now(), now() + timedelta(hours=1))])
    elsewhere.write_text(json.dumps(planted))
    agent.state_dir.mkdir(mode=0o700)
    stored = agent.state_dir / "snapshot.json"
    if kind == "symlink":
        stored.symlink_to(elsewhere)
    else:  # the control: the same content as the agent's own file is believed
        stored.write_text(elsewhere.read_text())

    agent.start()

    if kind == "regular file":
        assert wait_for(lambda: alice.name in acl_users(agent.device(0)), timeout=5)
        return
    assert acl_users(agent.device(0)) == set(), "\n".join(agent.log)
    assert wait_for(lambda: portal.events("snapshot_refused"), timeout=10)
    (refusal,) = portal.events("snapshot_refused")
    assert refusal["message"] == f"stored snapshot: {stored} is a symbolic link: not followed"

    agent.send(agent.snapshot([lease(2, alice.name, [agent.uuid(1)], now(), now() + timedelta(hours=1))], version=5))

    assert wait_for(lambda: alice.name in acl_users(agent.device(1)), timeout=10)
    assert not stored.is_symlink() and json.loads(stored.read_text())["version"] == 5
    assert json.loads(elsewhere.read_text()) == planted  # nothing written through the link
    assert acl_users(agent.device(0)) == set()


def holder_on_an_open_gpu(agent: AgentRun, spawn: Callable[..., subprocess.Popen[str]], user: Any) -> Any:
    """``user`` holding GPU 1, as if their slot had just ended and they kept the device open: the agent is
    started once to create the stand-in device files, stopped, and GPU 1 left open to all."""
    agent.start()
    agent.stop()
    os.chmod(agent.device(1), 0o666)  # noqa: S103 - so the process can open it without a grant
    return spawn(agent.device(1), user=user)


@pytest.mark.parametrize("kind", ["symlink", "regular file"])
def test_a_symlinked_revocation_log_is_not_followed(new_agent, portal, unix_users, spawn, kind):
    agent = new_agent(grace_seconds=1)
    bob = unix_users[1]
    job = holder_on_an_open_gpu(agent, spawn, bob)
    elsewhere = agent.home / "elsewhere.json"
    # Signed with the right secret, even: what a link points to is never read.
    elsewhere.write_text(json.dumps(revocation_log([[agent.uuid(1), bob.name, now().isoformat()]], agent.secret)))
    log = agent.state_dir / "revoked.json"
    if kind == "symlink":
        log.symlink_to(elsewhere)
    else:  # the control: the same log as the agent's own file makes bob's job a leftover, ended
        log.write_text(elsewhere.read_text())
    before = elsewhere.read_bytes()

    agent.start()

    if kind == "regular file":
        assert wait_for(lambda: job.poll() is not None, timeout=15), "\n".join(agent.log)
        assert wait_for(lambda: portal.events("ended"), timeout=5)
        return
    assert wait_for(lambda: portal.events("violation"), timeout=10)
    assert wait_for(lambda: not log.is_symlink(), timeout=10)  # replaced by the agent's own, signed
    time.sleep(3)  # three reconciles after the grace period: a leftover would have been ended by now
    assert job.poll() is None
    assert [event["pid"] for event in portal.events("violation")] == [job.pid]
    assert not portal.events("ended")
    (ignored,) = [e for e in portal.events("store_failed") if "revocation log" in e.get("message", "")]
    assert ignored["message"] == f"revocation log ignored: {log} is a symbolic link: not followed"
    assert elsewhere.read_bytes() == before
    assert json.loads(log.read_text())["kind"] == "revocation-log"


# -- a revocation log edited by hand ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "tampering", ["signed with another secret", "entry added by hand", "unsigned (the old format)", "not JSON"]
)
def test_a_tampered_revocation_log_is_ignored_and_reported_and_ends_nothing(
    new_agent, portal, unix_users, spawn, tampering
):
    """A local user who could write the log would name whose processes the agent ends. The log is
    ignored: bob's job is only a violation (reported, left running by default), not a leftover."""
    agent = new_agent(grace_seconds=1)
    alice, bob = unix_users[0], unix_users[1]
    job = holder_on_an_open_gpu(agent, spawn, bob)
    at = (now() - timedelta(seconds=5)).isoformat()
    genuine = revocation_log([[agent.uuid(0), alice.name, at]], agent.secret)  # what the agent itself wrote
    content = {
        "signed with another secret": json.dumps(revocation_log([[agent.uuid(1), bob.name, at]], "0" * 64)),
        "entry added by hand": json.dumps(
            {**genuine, "revocations": [*genuine["revocations"], [agent.uuid(1), bob.name, at]]}
        ),
        "unsigned (the old format)": json.dumps([[agent.uuid(1), bob.name, at]]),
        "not JSON": f'[["{agent.uuid(1)}", "{bob.name}"',
    }[tampering]
    log = agent.state_dir / "revoked.json"
    log.write_text(content)

    agent.start()

    assert wait_for(lambda: portal.events("violation"), timeout=10), "\n".join(agent.log)
    time.sleep(3)  # three reconciles after the grace period: a leftover would have been ended by now
    assert job.poll() is None
    assert [event["pid"] for event in portal.events("violation")] == [job.pid]
    assert not portal.events("ended")
    (ignored,) = [e for e in portal.events("store_failed") if "revocation log" in e.get("message", "")]
    reason = {
        "signed with another secret": "bad or missing signature",
        "entry added by hand": "bad or missing signature",
        "unsigned (the old format)": "not a revocation log",
        "not JSON": "not valid JSON",
    }[tampering]
    assert ignored["message"].startswith(f"revocation log ignored: {log}: {reason}")


def test_a_revocation_log_the_agent_signed_still_ends_the_leftovers(new_agent, portal, unix_users, spawn):
    """The control for the test above: the same entry, signed with the node's secret, is believed."""
    agent = new_agent(grace_seconds=1)
    bob = unix_users[1]
    job = holder_on_an_open_gpu(agent, spawn, bob)
    at = (now() - timedelta(seconds=5)).isoformat()
    (agent.state_dir / "revoked.json").write_text(
        json.dumps(revocation_log([[agent.uuid(1), bob.name, at]], agent.secret))
    )

    agent.start()

    assert wait_for(lambda: job.poll() is not None, timeout=15), "\n".join(agent.log)
    assert job.returncode == -15
    assert wait_for(lambda: portal.events("ended"), timeout=5)
    assert not portal.events("violation")
    assert not portal.events("store_failed")
