"""The agent as it runs on a node: its own process, a real Celery worker on real Redis, real ACLs
on stand-in device files, real processes of real (throwaway) users. Only the GPU is simulated.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import time
from datetime import timedelta

import pytest

from gpubook_agent import protocol
from gpubook_agent.gpus.mig import read_mig_minors
from gpubook_agent.gpus.simulated import MEMORY_TOTAL_MIB, process_mib
from tests.agent.harness import AgentRun, PrivateRedis, acl_users, lease, now, wait_for

pytestmark = pytest.mark.usefixtures("unix_users")


def test_access_opens_at_the_slot_start_and_closes_at_its_end(make_agent, unix_users, try_open):
    agent = make_agent()
    alice = unix_users[0]
    start = now() + timedelta(seconds=2)
    end = start + timedelta(seconds=2)
    agent.send(agent.snapshot([lease(1, alice.name, [agent.uuid(0)], start, end)]))

    assert wait_for(lambda: agent.stored_snapshot() is not None, timeout=5)
    assert acl_users(agent.device(0)) == set()  # nothing before the start
    granted = wait_for(lambda: alice.name in acl_users(agent.device(0)), timeout=10)
    granted_at = now()
    assert granted is not None
    assert timedelta(0) <= granted_at - start < timedelta(seconds=2)
    assert try_open(agent.device(0), alice) == "opened"
    assert try_open(agent.device(1), alice) == "denied"  # only the booked GPU

    assert wait_for(lambda: alice.name not in acl_users(agent.device(0)), timeout=10)
    assert timedelta(0) <= now() - end < timedelta(seconds=2)
    assert try_open(agent.device(0), alice) == "denied"


def test_the_end_is_enforced_with_the_broker_and_the_portal_both_gone(make_agent, portal, unix_users):
    broker = PrivateRedis()
    try:
        agent = make_agent(broker_url=broker.url)
        alice = unix_users[0]
        start, end = now() + timedelta(seconds=1), now() + timedelta(seconds=5)
        agent.send(agent.snapshot([lease(1, alice.name, [agent.uuid(0)], start, end)]))
        assert wait_for(lambda: alice.name in acl_users(agent.device(0)), timeout=10)
    finally:
        broker.stop()
    portal.stop()

    assert wait_for(lambda: alice.name not in acl_users(agent.device(0)), timeout=10)
    assert timedelta(0) <= now() - end < timedelta(seconds=2)
    assert agent.process.poll() is None  # still running, still enforcing


def test_a_launch_runs_as_the_user_with_its_slot_and_is_gone_at_its_end_with_the_broker_and_the_portal_gone(
    make_agent, portal, unix_users
):
    broker = PrivateRedis()
    alice = unix_users[0]
    marker = f"86{alice.uid}"  # how long the launch's child sleeps: a number no other process here sleeps
    try:
        agent = make_agent(broker_url=broker.url, grace_seconds=2)
        start, end = now() + timedelta(seconds=1), now() + timedelta(seconds=6)
        # A launch that ignores SIGTERM and starts a child of its own: the grace, then SIGKILL for both.
        script = f"trap '' TERM; sleep {marker} & echo started; while :; do sleep 0.2; done"
        request = protocol.launch_request(number=1, kind="command", image="", argv=["/bin/sh", "-c", script])
        launched = protocol.lease(
            reservation=1, user=alice.name, gpus=[agent.uuid(0)], start=start, end=end, launches=[request]
        )
        agent.send(agent.snapshot([launched]))
        assert wait_for(lambda: portal.events("launch_started"), timeout=10)
        assert now() >= start  # not before its slot
        assert wait_for(lambda: _launch_states(portal).get(1) == "running", timeout=10)
        assert _processes_named(marker) and all(uid == alice.uid for uid in _processes_named(marker).values())
    finally:
        broker.stop()
    portal.stop()

    assert wait_for(lambda: not _processes_named(marker), timeout=20)
    assert now() - end <= timedelta(seconds=2 + 5)  # within the grace and 5 s of the slot's end
    assert agent.process.poll() is None


def _launch_states(portal) -> dict[int, str]:
    return {item["number"]: item["state"] for body in portal.received["heartbeat"] for item in body.get("launches", [])}


def _processes_named(seconds: str) -> dict[int, int]:
    """pid -> uid of the processes running ``sleep <seconds>`` (read from /proc)."""
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                    if cmdline.read().split(b"\0")[:2] == [b"sleep", seconds.encode()]:
                        found[int(entry)] = os.stat(f"/proc/{entry}").st_uid
            except OSError:
                continue
    return found


def test_a_restarted_agent_restores_its_leases_and_removes_everything_else(make_agent, unix_users, portal):
    agent = make_agent()
    alice, bob, mallory = unix_users
    slot_end = now() + timedelta(minutes=5)
    short_end = now() + timedelta(seconds=3)
    agent.send(
        agent.snapshot(
            [
                lease(1, alice.name, [agent.uuid(0)], now(), slot_end),
                lease(2, bob.name, [agent.uuid(1)], now(), short_end),
            ]
        )
    )
    assert wait_for(lambda: bob.name in acl_users(agent.device(1)), timeout=10)

    agent.kill()
    # While the agent is down: someone hands mallory a GPU by hand, and bob's slot ends.
    subprocess.run(["setfacl", "-m", f"u:{mallory.name}:rw", "--", agent.device(0)], check=True)  # noqa: S603, S607
    time.sleep(max(0.0, (short_end - now()).total_seconds()) + 0.2)
    agent.start()

    assert acl_users(agent.device(0)) == {alice.name}, "\n".join(agent.log)  # restored before listening to anyone
    assert acl_users(agent.device(1)) == set()


@pytest.mark.parametrize(
    "forgery", ["unsigned", "wrong secret", "older", "other node", "not a dict", "hostile user", "hostile gpu"]
)
def test_a_forged_or_stale_snapshot_is_refused_and_changes_nothing(make_agent, unix_users, portal, forgery):
    agent = make_agent()
    alice, _, mallory = unix_users
    agent.send(agent.snapshot([lease(1, alice.name, [agent.uuid(0)], now(), now() + timedelta(hours=1))]))
    agent.send(agent.snapshot([lease(1, alice.name, [agent.uuid(0)], now(), now() + timedelta(hours=1))]))
    assert wait_for(lambda: (agent.stored_snapshot() or {}).get("version") == 2, timeout=10)
    stored = agent.stored_snapshot()

    evil = [lease(9, mallory.name, [agent.uuid(0), agent.uuid(1)], now(), now() + timedelta(hours=9))]
    forged = {
        "unsigned": {**agent.snapshot(evil, version=99), "signature": ""},
        "wrong secret": agent.snapshot(evil, version=99, secret="0" * 64),
        "older": agent.snapshot(evil, version=1),
        "other node": {**agent.snapshot(evil, version=99), "node": "elsewhere"},
        "not a dict": ["leases", evil],
        # Signed with the right secret, but with content no portal would send: still refused.
        "hostile user": agent.snapshot([{**evil[0], "user": "bob,u:eve:rw"}], version=99),
        "hostile gpu": agent.snapshot([{**evil[0], "gpus": ["../../../dev/sda"]}], version=99),
    }[forgery]
    agent.send(forged)

    assert wait_for(lambda: portal.events("snapshot_refused"), timeout=10)
    assert agent.stored_snapshot() == stored
    assert acl_users(agent.device(0)) == {alice.name}
    assert acl_users(agent.device(1)) == set()


# Each malformed case, and what the refusal the agent reports says.
MALFORMED = {
    "non-hex signature": "bad or missing signature",
    "non-ASCII signature": "bad or missing signature",
    "10,000-deep nesting": "nested deeper than",
    "10,000-deep nesting of the message itself": "cannot be decoded",
    "50 MB body": "larger than",
    "a message that is not JSON": "cannot be decoded",
    "a pickled message": "an invalid message",
    "two arguments": "one snapshot argument",
    "issued 30 days ago": "MAX_SNAPSHOT_AGE_SECONDS",
    "issued 3 minutes ahead": "ahead of this node's clock",
}


def send_malformed(agent: AgentRun, case: str, evil: list[dict]) -> None:
    """Put ``case`` on the agent's queue, as a holder of the broker URL could; believed, it would give ``evil``."""
    good = agent.snapshot(evil, version=99)
    text = json.dumps(good)
    if case == "non-hex signature":
        agent.send({**good, "signature": "z" * 64})
    elif case == "non-ASCII signature":
        agent.send({**good, "signature": "é" * 64})
    elif case == "10,000-deep nesting":
        agent.send(text[:-1] + ',"x":' + "[" * 10_000 + "]" * 10_000 + "}")
    elif case == "10,000-deep nesting of the message itself":  # kombu's own parser would recurse
        agent.send_raw("[[" + "[" * 10_000 + "]" * 10_000 + "], {}, {}]")
    elif case == "50 MB body":
        agent.send(text[:-1] + ',"pad":"' + "x" * 50 * 1024 * 1024 + '"}')
    elif case == "a message that is not JSON":
        agent.send_raw("this is not json {")
    elif case == "a pickled message":
        agent.send_raw(pickle.dumps(([good], {}, {})), content_type="application/x-python-serialize")
    elif case == "two arguments":
        agent.send_raw(json.dumps([[text, text], {}, {}]))
    elif case == "issued 30 days ago":
        agent.send(agent.snapshot(evil, version=99, issued_at=now() - timedelta(days=30)))
    elif case == "issued 3 minutes ahead":
        agent.send(agent.snapshot(evil, version=99, issued_at=now() + timedelta(minutes=3)))
    else:
        raise AssertionError(case)


@pytest.mark.parametrize("case", MALFORMED)
def test_malformed_input_is_refused_reported_and_changes_nothing(make_agent, unix_users, portal, case):
    """Through Celery, as it arrives: the agent reports each refusal (Celery alone would only log what
    it cannot decode), keeps its snapshot and ACLs, and carries on."""
    agent = make_agent()
    alice, _, mallory = unix_users
    agent.send(agent.snapshot([lease(1, alice.name, [agent.uuid(0)], now(), now() + timedelta(hours=1))]))
    assert wait_for(lambda: alice.name in acl_users(agent.device(0)), timeout=10)
    stored = agent.stored_snapshot()

    send_malformed(
        agent, case, [lease(9, mallory.name, [agent.uuid(0), agent.uuid(1)], now(), now() + timedelta(hours=9))]
    )

    assert wait_for(lambda: portal.events("snapshot_refused"), timeout=15), "\n".join(agent.log[-20:])
    (refusal,) = portal.events("snapshot_refused")
    assert MALFORMED[case] in refusal["message"]
    assert agent.stored_snapshot() == stored
    assert acl_users(agent.device(0)) == {alice.name}
    assert acl_users(agent.device(1)) == set()
    assert {event["user"] for event in portal.events("granted")} == {alice.name}
    assert portal.events("revoked") == [] and portal.events("ended") == []
    # ...and the agent goes on taking good snapshots.
    agent.send(agent.snapshot([]))
    assert wait_for(lambda: alice.name not in acl_users(agent.device(0)), timeout=10)


def test_the_object_form_older_portals_push_is_still_applied(make_agent, unix_users, portal):
    agent = make_agent()
    alice = unix_users[0]
    snapshot = agent.snapshot([lease(1, alice.name, [agent.uuid(0)], now(), now() + timedelta(hours=1))])

    agent.send(snapshot, as_object=True)

    assert wait_for(lambda: alice.name in acl_users(agent.device(0)), timeout=10)
    assert portal.events("snapshot_refused") == []


def test_after_the_grace_period_the_holders_processes_end_and_nobody_elses(make_agent, unix_users, portal, spawn):
    agent = make_agent(grace_seconds=1)
    alice, bob, _ = unix_users
    end = now() + timedelta(seconds=2)
    agent.send(
        agent.snapshot(
            [
                lease(1, alice.name, [agent.uuid(0)], now(), end),
                lease(2, bob.name, [agent.uuid(1)], now(), now() + timedelta(hours=1)),
            ]
        )
    )
    assert wait_for(lambda: alice.name in acl_users(agent.device(0)), timeout=10)
    assert wait_for(lambda: bob.name in acl_users(agent.device(1)), timeout=10)
    polite = spawn(agent.device(0), user=alice)
    stubborn = spawn(agent.device(0), user=alice, ignore_term=True)
    bobs = spawn(agent.device(1), user=bob)
    roots = spawn(agent.device(0), user=None)

    assert wait_for(lambda: polite.poll() is not None and stubborn.poll() is not None, timeout=15)
    ended_at = now()
    assert ended_at - end >= timedelta(seconds=1)  # not before the grace period is over
    assert polite.returncode == -15  # SIGTERM was enough
    assert stubborn.returncode == -9  # it ignored SIGTERM, so SIGKILL
    assert bobs.poll() is None and roots.poll() is None
    assert wait_for(lambda: portal.events("ended"), timeout=5)
    assert portal.events("leftover")[0]["user"] == alice.name
    assert sorted(portal.events("ended")[0]["pids"]) == sorted([polite.pid, stubborn.pid])


def test_use_without_a_booking_is_reported_and_left_alone_by_default(make_agent, unix_users, portal, spawn):
    agent = make_agent()
    _, _, mallory = unix_users
    subprocess.run(["chmod", "0666", agent.device(1)], check=True)  # noqa: S603, S607 - a node left open
    intruder = spawn(agent.device(1), user=mallory)

    assert wait_for(lambda: portal.events("violation"), timeout=10)
    (violation,) = portal.events("violation")
    assert (violation["user"], violation["pid"], violation["gpu"]) == (mallory.name, intruder.pid, agent.uuid(1))
    time.sleep(1.5)  # a reconcile or two later: reported once, not ended
    assert intruder.poll() is None and len(portal.events("violation")) == 1


def test_use_without_a_booking_is_ended_when_the_policy_says_so(make_agent, unix_users, portal, spawn):
    agent = make_agent(end_violations="true")
    _, _, mallory = unix_users
    subprocess.run(["chmod", "0666", agent.device(1)], check=True)  # noqa: S603, S607
    intruder = spawn(agent.device(1), user=mallory)

    assert wait_for(lambda: intruder.poll() is not None, timeout=15)
    assert wait_for(lambda: portal.events("violation") and portal.events("ended"), timeout=5)


def test_the_agent_reports_heartbeat_and_telemetry_with_process_owners(make_agent, unix_users, portal, spawn):
    agent = make_agent()
    alice = unix_users[0]
    agent.send(agent.snapshot([lease(1, alice.name, [agent.uuid(0)], now(), now() + timedelta(hours=1))]))
    assert wait_for(lambda: alice.name in acl_users(agent.device(0)), timeout=10)
    job = spawn(agent.device(0), user=alice)

    def busy_sample():
        for body in portal.received["telemetry"]:
            for gpu in body["gpus"]:
                if gpu["uuid"] == agent.uuid(0) and gpu["processes"]:
                    return gpu
        return None

    assert wait_for(busy_sample, timeout=10)
    sample = busy_sample()
    assert sample["processes"] == [
        {"pid": job.pid, "user": alice.name, "used_memory_mib": process_mib(MEMORY_TOTAL_MIB, 1)}
    ]
    assert sample["utilization_pct"] > 0
    assert wait_for(lambda: any(b["acls"].get(agent.uuid(0)) == [alice.name] for b in portal.received["heartbeat"]), 5)
    heartbeat = portal.received["heartbeat"][-1]
    assert heartbeat["applied_version"] == 1 and heartbeat["backend"] == "simulated"


def test_leftovers_are_ended_even_when_the_agent_restarts_during_the_grace_period(
    make_agent, unix_users, portal, spawn
):
    agent = make_agent(grace_seconds=2)
    alice = unix_users[0]
    agent.send(agent.snapshot([lease(1, alice.name, [agent.uuid(0)], now(), now() + timedelta(seconds=2))]))
    assert wait_for(lambda: alice.name in acl_users(agent.device(0)), timeout=10)
    job = spawn(agent.device(0), user=alice)
    assert wait_for(lambda: alice.name not in acl_users(agent.device(0)), timeout=10)

    agent.kill()  # within the grace period: whatever it had in memory about the cleanup is gone
    agent.start()

    assert wait_for(lambda: job.poll() is not None, timeout=15), "\n".join(agent.log)
    assert job.returncode == -15
    assert wait_for(lambda: portal.events("ended"), timeout=5)
    assert not portal.events("violation")  # a leftover of a revoked holder, not "use without a booking"


def test_a_stopped_agent_leaves_every_gpu_closed_and_a_restart_reopens_the_running_slot(make_agent, unix_users):
    agent = make_agent()
    alice = unix_users[0]
    agent.send(agent.snapshot([lease(1, alice.name, [agent.uuid(0)], now(), now() + timedelta(hours=1))]))
    assert wait_for(lambda: alice.name in acl_users(agent.device(0)), timeout=10)

    agent.stop()  # SIGTERM, as systemctl stop does
    assert agent.process.returncode == 0
    assert acl_users(agent.device(0)) == set()  # nobody enforces the end while it is down: closed

    agent.start()
    assert wait_for(lambda: alice.name in acl_users(agent.device(0)), timeout=5)


def test_a_slice_of_a_mig_card_opens_and_closes_with_its_lease_and_the_heartbeat_shows_the_layout(
    make_agent, unix_users, portal, spawn, try_open
):
    agent = make_agent(grace_seconds=1, simulated_mig="0:3g.40gb,2g.20gb,2g.20gb")
    alice, bob, _ = unix_users
    assert wait_for(lambda: portal.received["heartbeat"], timeout=10)
    (card,) = portal.received["heartbeat"][0]["mig"]
    assert (card["uuid"], card["mode_current"], card["mode_pending"]) == (agent.uuid(0), True, True)
    assert [(s["profile"], s["placement_start"], s["placement_size"]) for s in card["slices"]] == [
        ("2g.20gb", 0, 2),
        ("2g.20gb", 2, 2),
        ("3g.40gb", 4, 4),
    ]
    first, other = card["slices"][2], card["slices"][0]
    minors = read_mig_minors(str(agent.device_dir / "mig-minors"))
    caps = agent.device_dir / "nvidia-caps"
    first_gi, other_gi = first["gpu_instance_id"], other["gpu_instance_id"]
    first_caps = [
        str(caps / f"nvidia-cap{minors[f'gpu0/gi{first_gi}{suffix}']}") for suffix in ("/access", "/ci0/access")
    ]
    other_caps = [str(caps / f"nvidia-cap{minors[f'gpu0/gi{other_gi}/access']}")]
    end = now() + timedelta(seconds=3)
    agent.send(
        agent.snapshot(
            [
                lease(1, alice.name, [first["uuid"]], now(), end),
                lease(2, bob.name, [other["uuid"]], now(), now() + timedelta(hours=1)),
            ]
        )
    )

    assert wait_for(lambda: alice.name in acl_users(first_caps[1]), timeout=10)
    assert [try_open(path, alice) for path in [agent.device(0), *first_caps, *other_caps, agent.device(1)]] == [
        "opened",
        "opened",
        "opened",
        "denied",
        "denied",
    ]
    job = spawn(agent.device(0), user=alice, also=first_caps)
    assert wait_for(
        lambda: any(b["acls"].get(first["uuid"]) == [alice.name] for b in portal.received["heartbeat"]), timeout=5
    )

    def slice_sample():
        for body in portal.received["telemetry"]:
            for gpu in body["gpus"]:
                if gpu["uuid"] == first["uuid"] and gpu["processes"]:
                    return gpu
        return None

    assert wait_for(slice_sample, timeout=10)
    assert [(p["pid"], p["user"]) for p in slice_sample()["processes"]] == [(job.pid, alice.name)]

    assert wait_for(lambda: job.poll() is not None, timeout=15)  # the slot's end, then its grace
    assert now() - end >= timedelta(seconds=1)
    assert [try_open(path, alice) for path in [agent.device(0), *first_caps]] == ["denied"] * 3
    assert acl_users(agent.device(0)) == {bob.name}  # the card's file stays open to the other slice's holder
    assert wait_for(lambda: portal.events("ended"), timeout=5)
    assert portal.events("leftover")[0]["gpu"] == first["uuid"]
