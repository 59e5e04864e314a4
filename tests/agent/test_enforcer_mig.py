"""The enforcer on a simulated node with a card in MIG mode: real ACLs on the stand-in device and capability
files, real processes of the throwaway users opening them as a CUDA job does, and the MIG-off guard.

Card 0 is split ``3g.40gb, 2g.20gb, 2g.20gb`` (placed 2g at memory slices 0-1, 2g at 2-3, 3g at 4-7); card 1
is a whole card. As in test_enforcer.py, the tests drive ``offer``, ``converge``, ``reconcile`` and the
checker's work directly, with a clock they set.
"""

from __future__ import annotations

import shutil
import signal
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
from gpubook_agent.gpus import MigSliceInfo, open_configured_backend
from gpubook_agent.gpus.simulated import SimulatedBackend, simulated_mig_uuid
from gpubook_agent.signing import signed
from gpubook_agent.store import SnapshotStore
from tests.agent.harness import Clock, acl_users, lease, simulated_node_config

T0 = datetime(2030, 5, 6, 9, 0, tzinfo=UTC)
T1 = T0 + timedelta(hours=1)
T2 = T1 + timedelta(hours=1)
GRACE = 30.0
LAYOUT = "0:3g.40gb,2g.20gb,2g.20gb"


@dataclass
class MigNode:
    config: AgentConfig
    backend: SimulatedBackend
    enforcer: Enforcer
    store: SnapshotStore
    clock: Clock
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    layout: list[MigSliceInfo] = field(default_factory=list)  # card 0's slices while MIG is on

    @property
    def card(self) -> str:
        return self.backend.gpus()[0].uuid

    @property
    def whole(self) -> str:
        return self.backend.gpus()[1].uuid

    @property
    def parent(self) -> str:
        return self.backend.device_path(self.card)

    def slice(self, start: int) -> MigSliceInfo:
        """The slice placed at memory slice ``start`` of card 0 (2g at 0 and 2, 3g at 4)."""
        return next(item for item in self.layout if item.placement_start == start)

    def caps(self, start: int) -> tuple[str, ...]:
        return self.slice(start).capability_files

    def snapshot(self, leases: list[dict[str, Any]], *, version: int = 1) -> dict:
        body = {
            "node": self.config.node_name,
            "version": version,
            "issued_at": self.clock.now.isoformat(),
            "leases": leases,
        }
        return signed(body, self.config.lease_secret)

    def kinds(self) -> list[str]:
        return [kind for kind, _ in self.events]


@pytest.fixture
def node(unix_users) -> Iterator[MigNode]:
    home = Path(tempfile.mkdtemp(prefix="gpbt-mig-", dir="/tmp"))
    try:
        home.chmod(0o755)
        config = simulated_node_config(home, grace=GRACE, SIMULATED_MEMORY_MIB="81920", SIMULATED_MIG=LAYOUT)
        backend = open_configured_backend(config)
        assert isinstance(backend, SimulatedBackend)
        store = SnapshotStore(config.state_dir)
        clock = Clock(T0)
        events: list[tuple[str, dict[str, Any]]] = []
        enforcer = Enforcer(
            config=config,
            backend=backend,
            store=store,
            report=lambda kind, **fields: events.append((kind, fields)),
            clock=clock,
            accounts=AccountCheck(uid_min=1000),
        )
        (card,) = backend.mig_cards()
        yield MigNode(config, backend, enforcer, store, clock, events, list(card.slices))
        enforcer.stop(timeout=1)
    finally:
        shutil.rmtree(home)


def every_file(node: MigNode) -> list[str]:
    return [node.parent, node.backend.device_path(node.whole), *(path for s in (0, 2, 4) for path in node.caps(s))]


def opened(node: MigNode, try_open, user) -> set[str]:
    """The files ``user`` can open now, among the node's device and capability files."""
    return {path for path in every_file(node) if try_open(path, user) == "opened"}


# -- the layout ------------------------------------------------------------------------------------------


def test_the_card_lists_its_slices_placed_by_a100_rules_with_deterministic_uuids(node):
    (card,) = node.backend.mig_cards()

    assert (card.uuid, card.mode_current, card.mode_pending) == (node.card, True, True)
    assert (card.placement_slots, card.compute_slices) == (8, 7)
    assert [(s.profile, s.placement_start, s.placement_size, s.compute_slices) for s in card.slices] == [
        ("2g.20gb", 0, 2, 2),
        ("2g.20gb", 2, 2, 2),
        ("3g.40gb", 4, 4, 3),
    ]
    assert [s.memory_mib for s in card.slices] == [20480, 20480, 40960]
    assert [s.uuid for s in card.slices] == [
        simulated_mig_uuid(node.config.node_name, 0, start, profile)
        for start, profile in ((0, "2g.20gb"), (2, "2g.20gb"), (4, "3g.40gb"))
    ]
    assert node.enforcer.mig_layout() == [card.as_dict()]
    assert set(node.enforcer.acls_in_force()) == {node.card, node.whole, *(s.uuid for s in card.slices)}


# -- a slice lease -----------------------------------------------------------------------------------------


def test_a_slice_holder_can_open_exactly_its_card_and_capability_files_during_the_slot(node, unix_users, try_open):
    alice = unix_users[0]
    first = node.slice(0)
    node.enforcer.offer(node.snapshot([lease(1, alice.name, [first.uuid], T0, T1)]))

    node.enforcer.converge(T0)

    assert opened(node, try_open, alice) == {node.parent, *first.capability_files}
    assert node.kinds().count("granted") == 1
    assert ("granted", {"gpu": first.uuid, "user": alice.name, "reservation": 1, "boundary": T0.isoformat()}) in (
        node.events
    )
    assert node.enforcer.acls_in_force()[first.uuid] == [alice.name]
    assert node.enforcer.acls_in_force()[node.card] == []  # the card is not hers: only one slice of it

    node.enforcer.converge(T1)

    assert opened(node, try_open, alice) == set()
    assert [fields["gpu"] for kind, fields in node.events if kind == "revoked"] == [first.uuid]


def test_another_slices_holder_cannot_open_the_first_ones_capability_files(node, unix_users, try_open):
    alice, bob = unix_users[0], unix_users[1]
    first, second = node.slice(0), node.slice(4)
    node.enforcer.offer(
        node.snapshot([lease(1, alice.name, [first.uuid], T0, T2), lease(2, bob.name, [second.uuid], T0, T2)])
    )

    node.enforcer.converge(T0)

    assert opened(node, try_open, alice) == {node.parent, *first.capability_files}
    assert opened(node, try_open, bob) == {node.parent, *second.capability_files}
    assert acl_users(node.parent) == {alice.name, bob.name}  # the card's device file is shared


def test_the_shared_device_file_keeps_a_users_entry_while_any_of_their_slices_needs_it(node, unix_users, try_open):
    alice, bob = unix_users[0], unix_users[1]
    first, second, third = node.slice(0), node.slice(2), node.slice(4)
    node.enforcer.offer(
        node.snapshot(
            [
                lease(1, alice.name, [first.uuid], T0, T1),
                lease(2, alice.name, [second.uuid], T0, T2),
                lease(3, bob.name, [third.uuid], T0, T1),
            ]
        )
    )
    node.enforcer.converge(T0)
    node.events.clear()

    node.enforcer.converge(T1)  # alice's first slice ends, her second goes on; bob's ends

    assert acl_users(node.parent) == {alice.name}
    assert opened(node, try_open, alice) == {node.parent, *second.capability_files}
    assert opened(node, try_open, bob) == set()
    assert sorted((fields["gpu"], fields["user"]) for kind, fields in node.events if kind == "revoked") == sorted(
        [(first.uuid, alice.name), (third.uuid, bob.name)]
    )


def test_a_card_lease_in_mig_mode_opens_the_card_and_all_its_slices(node, unix_users, try_open):
    carol = unix_users[2]
    node.enforcer.offer(node.snapshot([lease(1, carol.name, [node.card], T0, T1)]))

    node.enforcer.converge(T0)

    slices = [node.slice(start) for start in (0, 2, 4)]
    assert opened(node, try_open, carol) == {node.parent, *(path for s in slices for path in s.capability_files)}
    in_force = node.enforcer.acls_in_force()
    assert all(in_force[uuid] == [carol.name] for uuid in [node.card, *(s.uuid for s in slices)])
    assert node.enforcer.desired(T0)[slices[1].uuid] == {carol.name}

    node.enforcer.converge(T1)
    assert opened(node, try_open, carol) == set()


def test_a_whole_card_beside_the_mig_card_is_booked_as_before(node, unix_users, try_open):
    alice = unix_users[0]
    node.enforcer.offer(node.snapshot([lease(1, alice.name, [node.whole], T0, T1)]))

    node.enforcer.converge(T0)

    assert opened(node, try_open, alice) == {node.backend.device_path(node.whole)}


# -- the MIG-off guard ---------------------------------------------------------------------------------------


def test_a_pending_mode_change_keeps_the_card_file_closed_to_slice_holders_and_says_so(node, unix_users, try_open):
    alice = unix_users[0]
    first = node.slice(0)
    node.backend.set_mig_mode(node.card, current=True, pending=False)  # nvidia-smi -mig 0, not reset yet
    node.enforcer.offer(node.snapshot([lease(1, alice.name, [first.uuid], T0, T1)]))

    node.enforcer.reconcile(T0)

    assert acl_users(node.parent) == set()
    assert try_open(node.parent, alice) == "denied"
    (refusal,) = [fields for kind, fields in node.events if kind == "lease_refused"]
    assert (refusal["gpu"], refusal["user"], refusal["reservation"]) == (first.uuid, alice.name, 1)
    assert node.card in refusal["message"] and first.uuid in refusal["message"]
    assert "pending" in refusal["message"]
    node.enforcer.reconcile(T0)
    assert node.kinds().count("lease_refused") == 1  # once


def test_a_mode_change_during_the_slot_closes_the_card_file_and_reopening_it_needs_mig_on_again(
    node, unix_users, try_open
):
    alice = unix_users[0]
    first = node.slice(0)
    node.enforcer.offer(node.snapshot([lease(1, alice.name, [first.uuid], T0, T2)]))
    node.enforcer.converge(T0)
    assert try_open(node.parent, alice) == "opened"

    node.backend.set_mig_mode(node.card, current=True, pending=False)
    node.enforcer.reconcile(T0 + timedelta(minutes=1))
    assert acl_users(node.parent) == set()

    node.backend.set_mig_mode(node.card, current=True, pending=True)  # the change undone: nvidia-smi -mig 1
    node.enforcer.reconcile(T0 + timedelta(minutes=2))
    assert acl_users(node.parent) == {alice.name}


def test_with_mig_off_a_slice_lease_touches_nothing_and_names_the_card_and_the_slice(node, unix_users, try_open):
    alice = unix_users[0]
    first = node.slice(0)
    node.backend.set_mig_mode(node.card, current=False, pending=False)  # the card reset with MIG off
    node.enforcer.offer(node.snapshot([lease(1, alice.name, [first.uuid], T0, T1)]))

    node.enforcer.reconcile(T0)

    assert opened(node, try_open, alice) == set()
    assert all(acl_users(path) == set() for path in every_file(node))
    (refusal,) = [fields for kind, fields in node.events if kind == "lease_refused"]
    assert node.card in refusal["message"] and first.uuid in refusal["message"]
    assert "unknown_gpu" not in node.kinds()
    assert node.enforcer.mig_layout()[0]["slices"] == []


def test_with_mig_off_a_card_lease_opens_the_card_file_alone(node, unix_users, try_open):
    carol = unix_users[2]
    node.backend.set_mig_mode(node.card, current=False, pending=False)
    node.enforcer.offer(node.snapshot([lease(1, carol.name, [node.card], T0, T1)]))

    node.enforcer.reconcile(T0)

    assert opened(node, try_open, carol) == {node.parent}


# -- what the agent finds on the files --------------------------------------------------------------------


def test_startup_removes_entries_on_capability_files_that_no_stored_lease_backs(node, unix_users):
    alice, mallory = unix_users[0], unix_users[2]
    first, second = node.slice(0), node.slice(2)
    for path in (node.parent, *first.capability_files):
        subprocess.run(["setfacl", "-m", f"u:{alice.name}:rw", "--", path], check=True)  # noqa: S603, S607
    subprocess.run(  # noqa: S603
        ["setfacl", "-m", f"u:{mallory.name}:rw", "--", second.capability_files[1]],  # noqa: S607
        check=True,
    )
    node.store.save(node.snapshot([lease(7, alice.name, [first.uuid], T0, T2)], version=4))
    node.clock.now = T1

    node.enforcer.startup()

    assert acl_users(node.parent) == {alice.name}
    assert all(acl_users(path) == {alice.name} for path in first.capability_files)
    assert acl_users(second.capability_files[1]) == set()
    assert node.events == [("revoked", {"gpu": second.uuid, "user": mallory.name})]


def test_a_clean_stop_takes_every_slice_grant_back(node, unix_users):
    alice, bob = unix_users[0], unix_users[1]
    node.enforcer.offer(
        node.snapshot([lease(1, alice.name, [node.slice(0).uuid], T0, T2), lease(2, bob.name, [node.card], T0, T2)])
    )
    node.enforcer.converge(T0)

    node.enforcer.revoke_all()

    assert all(acl_users(path) == set() for path in every_file(node))


# -- leftovers ----------------------------------------------------------------------------------------------


def test_leftovers_on_a_slice_are_ended_after_grace_but_not_the_same_users_job_on_a_slice_still_leased(
    node, unix_users, spawn
):
    alice, bob = unix_users[0], unix_users[1]
    first, second, third = node.slice(0), node.slice(2), node.slice(4)
    node.enforcer.offer(
        node.snapshot(
            [
                lease(1, alice.name, [first.uuid], T0, T1),
                lease(2, alice.name, [second.uuid], T0, T2),
                lease(3, bob.name, [third.uuid], T0, T2),
            ]
        )
    )
    node.enforcer.converge(T0)
    on_first = spawn(node.parent, user=alice, also=first.capability_files)
    on_second = spawn(node.parent, user=alice, also=second.capability_files)
    bobs = spawn(node.parent, user=bob, also=third.capability_files)
    node.enforcer.check_holders(T0)
    assert "violation" not in node.kinds()

    node.enforcer.converge(T1)  # alice's first slice ends
    node.enforcer.check_holders(T1 + timedelta(seconds=GRACE / 2))
    assert "violation" not in node.kinds() and on_first.poll() is None  # within its grace period

    after_grace = T1 + timedelta(seconds=GRACE)
    node.enforcer.run_due_cleanups(after_grace)
    node.enforcer.end_leftovers(first.uuid, alice.name, after_grace)

    assert on_first.wait(timeout=10) == -signal.SIGTERM
    assert on_second.poll() is None and bobs.poll() is None
    leftover = next(fields for kind, fields in node.events if kind == "leftover")
    assert leftover == {"gpu": first.uuid, "user": alice.name, "pids": [on_first.pid]}
    assert ("ended", {"gpu": first.uuid, "user": alice.name, "pids": [on_first.pid]}) in node.events
    node.enforcer.check_holders(after_grace)
    assert "violation" not in node.kinds()


def test_a_job_left_on_a_slice_past_its_grace_is_ended_by_a_restarted_agent(node, unix_users, spawn):
    alice = unix_users[0]
    first = node.slice(4)
    node.enforcer.offer(node.snapshot([lease(1, alice.name, [first.uuid], T0, T1)]))
    node.enforcer.converge(T0)
    job = spawn(node.parent, user=alice, also=first.capability_files)
    node.enforcer.converge(T1)
    node.enforcer.check_holders(T1)  # the checker writes the revocation log
    node.events.clear()

    node.clock.now = T1 + timedelta(seconds=3 * GRACE)  # the agent was away through the whole grace period
    restarted = Enforcer(
        config=node.config,
        backend=node.backend,
        store=node.store,
        report=lambda kind, **fields: node.events.append((kind, fields)),
        clock=node.clock,
        accounts=AccountCheck(uid_min=1000),
    )
    restarted.startup()
    restarted.start()  # its checker finds the job and, the revocation remembered, ends it as a leftover
    try:
        assert job.wait(timeout=15) == -signal.SIGTERM
    finally:
        restarted.stop(timeout=5)

    assert ("leftover", {"gpu": first.uuid, "user": alice.name, "pids": [job.pid]}) in node.events
    assert "violation" not in node.kinds()


def test_telemetry_samples_each_slice_with_its_own_processes(node, unix_users, spawn):
    alice = unix_users[0]
    first = node.slice(2)
    node.enforcer.offer(node.snapshot([lease(1, alice.name, [first.uuid], T0, T1)]))
    node.enforcer.converge(T0)
    job = spawn(node.parent, user=alice, also=first.capability_files)

    samples = {sample.uuid: sample for sample in node.backend.sample()}

    assert [p.pid for p in samples[first.uuid].processes] == [job.pid]
    assert samples[first.uuid].memory_total_mib == 20480
    assert samples[node.slice(0).uuid].processes == ()
    assert [p.pid for p in samples[node.card].processes] == [job.pid]  # the card counts every slice's jobs
    assert "temperature_c" in samples[first.uuid].missing
