"""The enforcer in-process: snapshots offered, the ACLs it wants at an instant, and converging real ACLs.

No threads and no Celery: the tests call ``offer``, ``converge``, ``reconcile`` and ``startup`` directly
with a clock they set. The GPUs are the simulated backend's stand-in device files; ACLs are real (set
and read with setfacl/getfacl), so the tests that change them need root and the throwaway users.
"""

# Tests run fixed argument lists of tools found on this machine (never a shell).
# ruff: noqa: S603, S607

from __future__ import annotations

import json
import pwd
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from gpubook_agent.accounts import AccountCheck
from gpubook_agent.config import AgentConfig
from gpubook_agent.enforcer import Enforcer
from gpubook_agent.gpus import open_backend
from gpubook_agent.signing import signed
from gpubook_agent.store import SnapshotStore
from tests.agent.harness import Clock, acl_users, lease, simulated_node_config

T0 = datetime(2030, 5, 6, 9, 0, tzinfo=UTC)
T1 = T0 + timedelta(hours=1)
T2 = T1 + timedelta(hours=1)
TICK = timedelta(microseconds=1)
GRACE = 30.0
ABSENT_GPU = "GPU-00000000-0000-0000-0000-000000000000"


# The tests that only ask what the enforcer wants name people who have no account on this machine;
# every other name (the throwaway users, root, www-data) is looked up for real.
NAMED_PEOPLE = {"alice": 61001, "bob": 61002, "carol": 61003}


def _accounts_with_named_people(name: str) -> int:
    return NAMED_PEOPLE[name] if name in NAMED_PEOPLE else pwd.getpwnam(name).pw_uid


def setfacl(path: str, user: str) -> None:
    subprocess.run(["setfacl", "-m", f"u:{user}:rw", "--", path], capture_output=True, check=True)


@dataclass
class Node:
    config: AgentConfig
    enforcer: Enforcer
    store: SnapshotStore
    clock: Clock
    gpus: list[str]
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def device(self, index: int) -> str:
        return self.enforcer.paths[self.gpus[index]]

    def snapshot(
        self,
        leases: list[dict[str, Any]],
        *,
        version: int = 1,
        secret: str | None = None,
        issued_at: datetime | None = None,
    ) -> dict:
        """Signed as the portal signs, issued now by the test's clock unless ``issued_at`` says otherwise."""
        issued = issued_at or self.clock.now
        body = {"node": self.config.node_name, "version": version, "issued_at": issued.isoformat(), "leases": leases}
        return signed(body, secret or self.config.lease_secret)

    def kinds(self) -> list[str]:
        return [kind for kind, _ in self.events]


@pytest.fixture
def node() -> Iterator[Node]:
    """A simulated two-GPU node in a /tmp directory the test users can traverse, and an enforcer for it."""
    home = Path(tempfile.mkdtemp(prefix="gpbt-enforcer-", dir="/tmp"))
    try:
        home.chmod(0o755)
        config = simulated_node_config(home, grace=GRACE)
        backend = open_backend("simulated", device_dir=config.device_dir, node_name=config.node_name, simulated_gpus=2)
        store = SnapshotStore(config.state_dir)
        clock = Clock(T0)
        events: list[tuple[str, dict[str, Any]]] = []
        enforcer = Enforcer(
            config=config,
            backend=backend,
            store=store,
            report=lambda kind, **fields: events.append((kind, fields)),
            clock=clock,
            accounts=AccountCheck(uid_min=1000, lookup=_accounts_with_named_people),
        )
        yield Node(config, enforcer, store, clock, [gpu.uuid for gpu in backend.gpus()], events)
    finally:
        shutil.rmtree(home)


# -- offer ------------------------------------------------------------------------------------


def test_a_valid_newer_snapshot_is_applied_and_stored(node):
    raw = node.snapshot([lease(1, "alice", [node.gpus[0]], T0, T1)], version=1)

    assert node.enforcer.offer(raw) == "applied"

    assert node.enforcer.applied_version == 1
    assert node.store.load() == raw
    assert node.events == [("snapshot_applied", {"version": 1, "leases": 1})]


def test_the_same_version_again_is_stale_and_silent(node):
    raw = node.snapshot([], version=3)
    node.enforcer.offer(raw)
    node.events.clear()

    assert node.enforcer.offer(raw) == "stale"

    assert node.events == []
    assert node.enforcer.applied_version == 3


def test_an_older_version_is_stale_and_reported(node):
    newer = node.snapshot([], version=5)
    node.enforcer.offer(newer)
    node.events.clear()

    assert node.enforcer.offer(node.snapshot([lease(1, "alice", [node.gpus[0]], T0, T1)], version=4)) == "stale"

    assert node.events == [("snapshot_refused", {"message": "version 4 is older than the applied version 5"})]
    assert node.enforcer.applied_version == 5
    assert node.store.load() == newer
    # Late pushes after a pull arrive older by the dozen: one report a minute, whatever their versions.
    assert node.enforcer.offer(node.snapshot([], version=3)) == "stale"
    assert len(node.events) == 1


def test_a_snapshot_signed_with_another_secret_is_refused_and_not_stored(node):
    raw = node.snapshot([lease(1, "alice", [node.gpus[0]], T0, T1)], secret="not the node's secret")

    assert node.enforcer.offer(raw) == "refused"

    assert node.events == [("snapshot_refused", {"message": "bad or missing signature"})]
    assert node.enforcer.applied_version == 0
    assert node.store.load() is None


def test_a_refused_snapshot_leaves_the_applied_one_in_force(node):
    good = node.snapshot([lease(1, "alice", [node.gpus[0]], T0, T1)], version=1)
    node.enforcer.offer(good)

    hostile = node.snapshot([lease(2, "../root", [node.gpus[0]], T0, T1)], version=2)
    assert node.enforcer.offer(hostile) == "refused"

    assert node.enforcer.applied_version == 1
    assert node.store.load() == good
    assert node.enforcer.desired(T0)[node.gpus[0]] == {"alice"}


# -- what should be, and when it changes ----------------------------------------------------------


def test_desired_follows_lease_starts_and_ends(node):
    g0, g1 = node.gpus
    node.enforcer.offer(node.snapshot([lease(1, "alice", [g0], T0, T1), lease(2, "bob", [g0, g1], T1, T2)]))
    desired = node.enforcer.desired

    assert desired(T0 - TICK) == {g0: set(), g1: set()}
    assert desired(T0) == {g0: {"alice"}, g1: set()}
    assert desired(T1 - TICK) == {g0: {"alice"}, g1: set()}
    assert desired(T1) == {g0: {"bob"}, g1: {"bob"}}
    assert desired(T2 - TICK) == {g0: {"bob"}, g1: {"bob"}}
    assert desired(T2) == {g0: set(), g1: set()}


def test_overlapping_leases_share_a_gpu(node):
    g0, _ = node.gpus
    node.enforcer.offer(node.snapshot([lease(1, "alice", [g0], T0, T2), lease(2, "bob", [g0], T1, T2)]))

    assert node.enforcer.desired(T1)[g0] == {"alice", "bob"}


def test_nothing_is_desired_without_a_snapshot(node):
    g0, g1 = node.gpus

    assert node.enforcer.desired(T0) == {g0: set(), g1: set()}
    assert node.enforcer.next_boundary(T0) is None


def test_next_boundary_is_the_first_start_or_end_after_now(node):
    g0, g1 = node.gpus
    node.enforcer.offer(node.snapshot([lease(1, "alice", [g0], T0, T1), lease(2, "bob", [g1], T1, T2)]))
    boundary = node.enforcer.next_boundary

    assert boundary(T0 - timedelta(days=1)) == T0
    assert boundary(T0 - TICK) == T0
    assert boundary(T0) == T1  # strictly after now: a boundary that is now has been handled
    assert boundary(T1) == T2
    assert boundary(T2) is None


def test_a_lease_on_a_gpu_this_node_lacks_is_reported_once(node):
    g0, _ = node.gpus
    node.enforcer.offer(node.snapshot([lease(1, "alice", [ABSENT_GPU], T0, T1)]))
    node.events.clear()

    for _ in range(3):
        node.enforcer.converge(T0)
        assert node.enforcer.desired(T0)[g0] == set()

    assert node.events == [("unknown_gpu", {"gpu": ABSENT_GPU, "user": "alice", "reservation": 1})]
    assert ABSENT_GPU not in node.enforcer.desired(T0)


def test_an_unknown_gpu_is_reported_again_for_a_new_snapshot(node):
    node.enforcer.offer(node.snapshot([lease(1, "alice", [ABSENT_GPU], T0, T1)], version=1))
    node.enforcer.converge(T0)
    node.enforcer.offer(node.snapshot([lease(1, "alice", [ABSENT_GPU], T0, T1)], version=2))
    node.enforcer.converge(T0)

    assert node.kinds().count("unknown_gpu") == 2


# -- making it so: real ACLs --------------------------------------------------------------------


def test_a_hand_over_revokes_before_it_grants(node, unix_users):
    a, b = unix_users[0].name, unix_users[1].name
    g0, g1 = node.gpus
    node.enforcer.offer(node.snapshot([lease(1, a, [g0], T0, T1), lease(2, b, [g0, g1], T1, T2)]))
    node.enforcer.converge(T0)
    assert acl_users(node.device(0)) == {a}
    assert acl_users(node.device(1)) == set()
    node.events.clear()

    node.enforcer.converge(T1)  # A's end and B's start are the same instant

    assert acl_users(node.device(0)) == {b}
    assert acl_users(node.device(1)) == {b}
    assert sorted(node.kinds()) == ["granted", "granted", "revoked"]  # GPUs change side by side
    revoked = next(event for event in node.events if event[0] == "revoked")
    assert revoked == ("revoked", {"gpu": g0, "user": a, "reservation": 1, "boundary": T1.isoformat()})
    granted = [fields for kind, fields in node.events if kind == "granted"]
    assert sorted((fields["gpu"], fields["user"]) for fields in granted) == sorted([(g0, b), (g1, b)])
    assert all(fields["reservation"] == 2 and fields["boundary"] == T1.isoformat() for fields in granted)
    on_g0 = [kind for kind, fields in node.events if fields["gpu"] == g0]
    assert on_g0 == ["revoked", "granted"]  # on one GPU, one setfacl: never both holders at once
    assert node.enforcer.acls_in_force() == {g0: [b], g1: [b]}
    assert node.enforcer.next_boundary(T1) == T1 + timedelta(seconds=GRACE)  # A's leftovers get cleaned up


def test_converging_twice_at_the_same_instant_changes_nothing(node, unix_users):
    a = unix_users[0].name
    node.enforcer.offer(node.snapshot([lease(1, a, [node.gpus[0]], T0, T1)]))
    node.enforcer.converge(T0)
    node.events.clear()

    node.enforcer.converge(T0)
    node.enforcer.reconcile(T0)

    assert node.events == []
    assert acl_users(node.device(0)) == {a}


def test_the_end_is_enforced_at_the_end_instant(node, unix_users):
    a = unix_users[0].name
    node.enforcer.offer(node.snapshot([lease(1, a, [node.gpus[0]], T0, T1)]))
    node.enforcer.converge(T0)

    node.enforcer.converge(T1 - TICK)
    assert acl_users(node.device(0)) == {a}
    node.enforcer.converge(T1)
    assert acl_users(node.device(0)) == set()


def test_startup_removes_grants_no_stored_lease_backs_and_keeps_the_backed_ones(node, unix_users):
    a, b = unix_users[0].name, unix_users[1].name
    g0, g1 = node.gpus
    setfacl(node.device(0), a)  # left from before a crash, or added by hand: nothing backs it
    setfacl(node.device(1), b)
    node.store.save(node.snapshot([lease(7, b, [g1], T0, T2)], version=4))
    node.clock.now = T1

    node.enforcer.startup()

    assert acl_users(node.device(0)) == set()
    assert acl_users(node.device(1)) == {b}
    assert node.events == [("revoked", {"gpu": g0, "user": a})]
    assert node.enforcer.applied_version == 4


def test_startup_grants_what_the_stored_snapshot_backs(node, unix_users):
    a = unix_users[0].name
    node.store.save(node.snapshot([lease(7, a, [node.gpus[0]], T0, T2)], version=4))
    node.clock.now = T1

    node.enforcer.startup()

    assert acl_users(node.device(0)) == {a}
    assert node.kinds() == ["granted"]


def test_a_stored_snapshot_signed_with_another_secret_is_not_trusted_at_startup(node, unix_users):
    a, b = unix_users[0].name, unix_users[1].name
    g0, g1 = node.gpus
    setfacl(node.device(0), a)
    setfacl(node.device(1), b)
    forged = node.snapshot([lease(7, a, [g0], T0, T2), lease(8, b, [g1], T0, T2)], version=9, secret="old secret")
    node.store.save(forged)
    node.clock.now = T1

    node.enforcer.startup()

    assert acl_users(node.device(0)) == set()
    assert acl_users(node.device(1)) == set()
    assert node.enforcer.applied_version == 0
    assert node.events[0] == ("snapshot_refused", {"message": "stored snapshot: bad or missing signature"})
    assert sorted(node.kinds()[1:]) == ["revoked", "revoked"]
    assert node.enforcer.offer(node.snapshot([], version=1)) == "applied"  # a real one is taken at once


def test_a_lease_for_an_account_the_node_lacks_is_refused_alone_and_reported_once(node, unix_users):
    a = unix_users[0].name
    ghost = f"gpbt_ghost{secrets.token_hex(3)}"  # a valid name, but no such account here
    g0, g1 = node.gpus
    node.enforcer.offer(node.snapshot([lease(1, ghost, [g0], T0, T1), lease(2, a, [g1], T0, T1)]))

    for _ in range(3):
        node.enforcer.converge(T0)
        node.enforcer.reconcile(T0)

    refusals = [fields for kind, fields in node.events if kind == "lease_refused"]
    assert refusals == [{"user": ghost, "reservation": 1, "message": f"there is no account {ghost!r} on this node"}]
    assert "grant_failed" not in node.kinds()  # refused before any setfacl ran
    assert node.kinds().count("granted") == 1
    assert acl_users(node.device(0)) == set()
    assert acl_users(node.device(1)) == {a}


@pytest.mark.parametrize("account", ["root", "www-data", "nobody"])
def test_a_lease_for_a_system_account_is_refused_and_the_rest_enforced(node, unix_users, account):
    """A signed snapshot may still name a system account (a careless admin, an old portal): the
    node refuses that lease by the account's uid, whatever its name."""
    pwd.getpwnam(account)  # Debian has all three
    a = unix_users[0].name
    g0, g1 = node.gpus
    node.enforcer.offer(node.snapshot([lease(1, account, [g0], T0, T1), lease(2, a, [g1], T0, T1)]))

    node.enforcer.converge(T0)

    assert acl_users(node.device(0)) == set()
    assert acl_users(node.device(1)) == {a}
    (refusal,) = [fields for kind, fields in node.events if kind == "lease_refused"]
    assert refusal["user"] == account and refusal["reservation"] == 1
    assert "system account" in refusal["message"] or "'nobody' account" in refusal["message"]


def test_a_refusal_is_reported_when_the_snapshot_arrives_before_the_slot_starts(node):
    node.enforcer.offer(node.snapshot([lease(5, "root", [node.gpus[0]], T1, T2)]))

    (refusal,) = [fields for kind, fields in node.events if kind == "lease_refused"]
    assert (refusal["user"], refusal["reservation"]) == ("root", 5)
    assert node.enforcer.desired(T1)[node.gpus[0]] == set()


def test_a_protected_user_is_refused_like_a_system_account(node, unix_users):
    a = unix_users[0].name
    enforcer = node.enforcer
    enforcer.accounts = AccountCheck(uid_min=1000, protected=frozenset({a}))
    enforcer.offer(node.snapshot([lease(1, a, [node.gpus[0]], T0, T1)]))

    enforcer.converge(T0)

    assert acl_users(node.device(0)) == set()
    assert "PROTECTED_USERS" in next(fields["message"] for kind, fields in node.events if kind == "lease_refused")


def test_a_hand_over_to_an_account_the_node_lacks_still_revokes_the_previous_holder(node, unix_users):
    a = unix_users[0].name
    ghost = f"gpbt_ghost{secrets.token_hex(3)}"
    g0, _ = node.gpus
    node.enforcer.offer(node.snapshot([lease(1, a, [g0], T0, T1), lease(2, ghost, [g0], T1, T2)]))
    node.enforcer.converge(T0)
    assert acl_users(node.device(0)) == {a}

    node.enforcer.converge(T1)

    assert acl_users(node.device(0)) == set()
    assert [kind for kind, _ in node.events if kind in ("revoked", "lease_refused")] == ["lease_refused", "revoked"]


def test_a_directory_outage_never_takes_a_running_grant_back(node, unix_users):
    """NSS answers "no such user" when LDAP or SSSD is unreachable: a lease already granted stays
    granted (its jobs keep running); a lease not granted yet waits for the directory to come back."""
    a, b = unix_users[0].name, unix_users[1].name
    outage = {"on": False}

    def lookup(name: str) -> int:
        if outage["on"]:
            raise KeyError(name)
        return pwd.getpwnam(name).pw_uid

    ticks = {"now": 0.0}
    node.enforcer.accounts = AccountCheck(uid_min=1000, lookup=lookup, clock=lambda: ticks["now"])
    g0, g1 = node.gpus
    node.enforcer.offer(node.snapshot([lease(1, a, [g0], T0, T2), lease(2, b, [g1], T1, T2)]))
    node.enforcer.converge(T0)
    assert acl_users(node.device(0)) == {a}

    outage["on"] = True
    ticks["now"] = 120.0  # every cached answer is old: the checker asks the directory again
    node.enforcer.check_holders(T0)
    node.enforcer.converge(T1)
    node.enforcer.reconcile(T1)

    assert acl_users(node.device(0)) == {a}  # kept
    assert acl_users(node.device(1)) == set()  # not granted while the directory says nothing
    assert "revoked" not in node.kinds()

    outage["on"] = False
    ticks["now"] = 240.0
    node.enforcer.check_holders(T1)
    node.enforcer.converge(T1)
    assert acl_users(node.device(1)) == {b}


def test_a_refused_lease_is_reported_once_across_snapshots_and_a_new_one_again(node):
    ghost = f"gpbt_ghost{secrets.token_hex(3)}"
    node.enforcer.offer(node.snapshot([lease(1, ghost, [node.gpus[0]], T0, T1)], version=1))
    node.enforcer.converge(T0)
    node.enforcer.offer(node.snapshot([lease(1, ghost, [node.gpus[0]], T0, T2)], version=2))  # beat's re-push
    node.enforcer.converge(T0)
    assert node.kinds().count("lease_refused") == 1

    node.enforcer.offer(node.snapshot([lease(3, ghost, [node.gpus[1]], T1, T2)], version=3))  # another booking

    assert node.kinds().count("lease_refused") == 2


def test_a_boundary_that_falls_during_a_pass_is_enforced_at_once_not_at_the_next_one(node, unix_users):
    a = unix_users[0].name
    g0, _ = node.gpus
    soon, later = T0 + timedelta(milliseconds=2), T0 + timedelta(seconds=3)
    node.enforcer.offer(node.snapshot([lease(1, a, [g0], soon, later)]))
    node.enforcer.converge(T0)  # enforced the state at T0 ...
    node.clock.now = T0 + timedelta(milliseconds=5)  # ... and the pass took 5 ms: ``soon`` is behind us

    assert node.enforcer.seconds_to_next_pass(T0, until_reconcile=5.0) == node.enforcer.MIN_WAIT
    node.enforcer.converge(node.clock.now)
    assert acl_users(node.device(0)) == {a}
    assert node.enforcer.seconds_to_next_pass(node.clock.now, until_reconcile=5.0) == pytest.approx(2.995)


def test_a_flood_of_junk_messages_is_reported_once_a_minute_not_once_each(node):
    for _ in range(50):
        assert node.enforcer.offer({"node": "junk"}) == "refused"

    assert node.kinds() == ["snapshot_refused"]


# -- malformed input: always a reported refusal, never an exception, never a change ----------------

MALFORMED = [
    "non-hex signature",
    "non-ASCII signature",
    "10,000-deep nesting",
    "10,000-deep nesting, as an object",
    "50 MB body",
    "issued 30 days ago",
    "issued 11 minutes ago",
    "issued 3 minutes ahead",
]


def malformed(node: Node, case: str, leases: list[dict[str, Any]]) -> Any:
    """A hostile snapshot, version 9, that would give ``leases`` if it were believed."""
    now = node.clock.now
    deep: list[Any] = []
    for _ in range(10_000):
        deep = [deep]
    return {
        "non-hex signature": lambda: {**node.snapshot(leases, version=9), "signature": "z" * 64},
        "non-ASCII signature": lambda: {**node.snapshot(leases, version=9), "signature": "é" * 64},
        "10,000-deep nesting": lambda: (
            json.dumps(node.snapshot(leases, version=9))[:-1] + ',"x":' + "[" * 10_000 + "]" * 10_000 + "}"
        ),
        "10,000-deep nesting, as an object": lambda: {**node.snapshot(leases, version=9), "x": deep},
        "50 MB body": lambda: json.dumps(node.snapshot([*leases, {"pad": "x" * 50 * 1024 * 1024}], version=9)),
        "issued 30 days ago": lambda: node.snapshot(leases, version=9, issued_at=now - timedelta(days=30)),
        "issued 11 minutes ago": lambda: node.snapshot(leases, version=9, issued_at=now - timedelta(minutes=11)),
        "issued 3 minutes ahead": lambda: node.snapshot(leases, version=9, issued_at=now + timedelta(minutes=3)),
    }[case]()


@pytest.mark.parametrize("case", MALFORMED)
def test_malformed_input_is_a_reported_refusal_and_changes_nothing(node, unix_users, case):
    a, mallory = unix_users[0].name, unix_users[2].name
    g0, g1 = node.gpus
    assert node.enforcer.offer(node.snapshot([lease(1, a, [g0], T0, T2)], version=5)) == "applied"
    node.enforcer.converge(T0)
    stored = node.store.load()
    node.events.clear()

    assert node.enforcer.offer(malformed(node, case, [lease(9, mallory, [g0, g1], T0, T2)])) == "refused"
    node.enforcer.reconcile(T0)
    node.enforcer.converge(T1)

    assert node.kinds() == ["snapshot_refused"]  # nothing granted, nothing revoked or ended
    assert node.enforcer.applied_version == 5
    assert node.store.load() == stored
    assert acl_users(node.device(0)) == {a}
    assert acl_users(node.device(1)) == set()


def test_an_input_that_trips_the_checks_themselves_is_a_refusal_not_an_exception(node):
    """Keys that JSON never has but an object can: signing it (json.dumps with sorted keys) raises
    TypeError. Whatever a check trips over is a reported refusal, as a hostile message must be."""
    hostile = {**node.snapshot([], version=2), 7: "not a string key"}

    assert node.enforcer.offer(hostile) == "refused"

    assert node.events == [("snapshot_refused", {"message": "snapshot not applied: TypeError while checking it"})]
    assert node.enforcer.applied_version == 0


def test_a_snapshot_as_json_text_is_applied_like_the_object_older_portals_send(node):
    as_text = json.dumps(node.snapshot([lease(1, "alice", [node.gpus[0]], T0, T1)], version=1))

    assert node.enforcer.offer(as_text) == "applied"
    assert node.enforcer.offer(node.snapshot([], version=2)) == "applied"
    assert node.enforcer.applied_version == 2


def test_a_snapshot_exactly_max_age_old_is_applied(node):
    issued = node.clock.now - timedelta(seconds=node.config.max_snapshot_age_seconds)

    assert node.enforcer.offer(node.snapshot([], version=1, issued_at=issued)) == "applied"


def test_the_stored_snapshot_is_enforced_however_old_it_is(node, unix_users):
    """At start the stored snapshot is the last word the node has: a long outage must not drop it."""
    a = unix_users[0].name
    node.store.save(node.snapshot([lease(1, a, [node.gpus[0]], T0, T0 + timedelta(days=40))], version=3))
    node.clock.now = T0 + timedelta(days=30)

    node.enforcer.startup()

    assert node.enforcer.applied_version == 3
    assert acl_users(node.device(0)) == {a}


# -- the version seen, for the pull --------------------------------------------------------------


def test_the_version_seen_counts_applied_and_authentic_refused_snapshots(node):
    node.enforcer.offer(node.snapshot([], version=3))
    assert node.enforcer.seen_version == 3

    old = node.snapshot([], version=7, issued_at=node.clock.now - timedelta(hours=1))
    assert node.enforcer.offer(old) == "refused"
    assert node.enforcer.seen_version == 7  # the portal did issue 7: no pull for it
    assert node.enforcer.applied_version == 3

    bad_lease = node.snapshot([lease(8, "../x", [node.gpus[0]], T0, T1)], version=8)
    assert node.enforcer.offer(bad_lease) == "refused"
    assert node.enforcer.seen_version == 8


def test_a_forged_version_never_counts_as_seen(node):
    """Anyone who can write to the queue could otherwise silence the pull with a huge version."""
    node.enforcer.offer(node.snapshot([], version=3))

    for forged in (
        node.snapshot([], version=10**15, secret="not the node's secret"),
        {**node.snapshot([], version=10**15), "signature": "é" * 64},
        {**node.snapshot([], version=10**15), "node": "another-node"},
        json.dumps(node.snapshot([], version=10**15)) + "junk",
    ):
        assert node.enforcer.offer(forged) == "refused"

    assert node.enforcer.seen_version == 3
