"""The idle power cap (gpubook_agent/power.py) on a simulated node: cards no lease holds are capped, a lease's start
gives its card the limit back before its ACL is granted, its end caps the card again, and turning the cap off (or
the node refusing it) gives every card back its limit. Real ACLs and throwaway users, as in test_enforcer.py; the
tests drive ``offer``, ``converge``, ``reconcile`` and ``startup`` with a clock they set.

The simulated cards are 400 W cards that accept limits from 100 W (a quarter) to 400 W, as an A100-SXM4 does.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from gpubook_agent.accounts import AccountCheck
from gpubook_agent.config import AgentConfig
from gpubook_agent.enforcer import Enforcer
from gpubook_agent.gpus import PowerLimitError, open_configured_backend
from gpubook_agent.gpus.simulated import SimulatedBackend
from gpubook_agent.signing import signed
from gpubook_agent.store import SnapshotStore
from tests.agent.harness import Clock, acl_users, lease, simulated_node_config

T0 = datetime(2030, 5, 6, 9, 0, tzinfo=UTC)
T1 = T0 + timedelta(hours=1)
T2 = T1 + timedelta(hours=1)
GRACE = 30.0
DEFAULT_W, MIN_W = 400.0, 100.0


@dataclass
class PowerNode:
    config: AgentConfig
    backend: SimulatedBackend
    store: SnapshotStore
    clock: Clock
    enforcer: Enforcer
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    sets: list[tuple[str, float]] = field(default_factory=list)  # every limit the agent set: (card, watts)

    @property
    def gpus(self) -> list[str]:
        return [gpu.uuid for gpu in self.backend.gpus()]

    def device(self, uuid: str) -> str:
        return self.backend.device_path(uuid)

    def limit(self, uuid: str) -> float:
        return self.backend.power_limits(uuid).current_w

    def limits(self) -> list[float]:
        return [self.limit(uuid) for uuid in self.gpus]

    def snapshot(self, leases: list[dict[str, Any]], *, version: int = 1, pct: int | None = None) -> dict:
        body = {
            "node": self.config.node_name,
            "version": version,
            "issued_at": self.clock.now.isoformat(),
            "leases": leases,
            "idle_power_limit_pct": pct,
        }
        return signed(body, self.config.lease_secret)

    def power_events(self) -> list[tuple[str, dict[str, Any]]]:
        return [(kind, fields) for kind, fields in self.events if kind.startswith("power_")]

    def new_enforcer(self) -> Enforcer:
        """Another agent process on the same node (a restart): same cards, same state directory."""
        return Enforcer(
            config=self.config,
            backend=self.backend,
            store=self.store,
            report=lambda kind, **fields: self.events.append((kind, fields)),
            clock=self.clock,
            accounts=AccountCheck(uid_min=1000),
        )


@pytest.fixture
def make_node(unix_users) -> Iterator[Callable[..., PowerNode]]:
    """A simulated two-card node of 400 W cards (``extra``: more config, e.g. ALLOW_POWER_CAP, SIMULATED_MIG), whose
    backend records every limit set."""
    homes: list[Path] = []
    enforcers: list[Enforcer] = []

    def make(**extra: str) -> PowerNode:
        home = Path(tempfile.mkdtemp(prefix="gpbt-power-", dir="/tmp"))
        homes.append(home)
        home.chmod(0o755)
        config = simulated_node_config(home, grace=GRACE, SIMULATED_POWER_W=str(DEFAULT_W), **extra)
        backend = open_configured_backend(config)
        assert isinstance(backend, SimulatedBackend)
        node = PowerNode(config, backend, SnapshotStore(config.state_dir), Clock(T0), enforcer=None)  # type: ignore[arg-type]
        real_set = backend.set_power_limit

        def recording_set(uuid: str, watts: float) -> None:
            real_set(uuid, watts)
            node.sets.append((uuid, watts))

        backend.set_power_limit = recording_set  # type: ignore[method-assign]
        node.enforcer = node.new_enforcer()
        enforcers.append(node.enforcer)
        return node

    try:
        yield make
    finally:
        for enforcer in enforcers:
            enforcer.stop(timeout=1)
        for home in homes:
            shutil.rmtree(home)


@pytest.fixture
def node(make_node) -> PowerNode:
    return make_node()


# -- off ----------------------------------------------------------------------------------------------------


def test_off_by_default_no_limit_is_even_read(node, unix_users, monkeypatch):
    def no_reading(uuid: str) -> None:
        raise AssertionError("a power limit was read with the idle power cap off")

    monkeypatch.setattr(node.backend, "power_limits", no_reading)
    node.enforcer.offer(node.snapshot([lease(1, unix_users[0].name, [node.gpus[0]], T1, T2)]))

    for moment in (T0, T1, T2):
        node.enforcer.converge(moment)
        node.enforcer.reconcile(moment)

    assert node.sets == []
    assert node.power_events() == []


# -- around a lease ------------------------------------------------------------------------------------------


def test_an_idle_card_is_capped_and_a_lease_gets_its_limit_back_before_access_then_its_end_caps_it_again(
    node, unix_users
):
    a = unix_users[0].name
    g0, g1 = node.gpus
    acl_at_each_set: list[tuple[str, float, set[str]]] = []
    recording_set = node.backend.set_power_limit

    def set_and_look(uuid: str, watts: float) -> None:
        acl_at_each_set.append((uuid, watts, acl_users(node.device(uuid))))
        recording_set(uuid, watts)

    node.backend.set_power_limit = set_and_look
    node.enforcer.offer(node.snapshot([lease(1, a, [g0], T1, T2)], pct=40))
    node.events.clear()

    node.enforcer.converge(T0)  # nobody holds either card

    assert node.limits() == [160.0, 160.0]  # 40 % of 400 W
    assert node.power_events() == [
        (
            "power_capped",
            {
                "gpu": uuid,
                "power_limit_w": 160.0,
                "message": "no lease holds the card: power limit 400 W -> 160 W (40 % of its default 400 W, within "
                "its range 100-400 W)",
            },
        )
        for uuid in (g0, g1)
    ]
    node.events.clear()

    node.enforcer.converge(T1)  # the lease starts on g0

    assert node.limits() == [DEFAULT_W, 160.0]
    assert acl_users(node.device(g0)) == {a}
    assert acl_at_each_set[-1] == (g0, DEFAULT_W, set())  # the limit came back while the card was still closed
    assert [kind for kind, _ in node.events] == ["power_restored", "granted"]
    assert node.events[0] == (
        "power_restored",
        {"gpu": g0, "power_limit_w": DEFAULT_W, "message": "power limit 160 W -> 400 W: a lease holds the card now"},
    )
    node.events.clear()

    node.enforcer.converge(T2)  # it ends

    assert node.limits() == [160.0, 160.0]
    assert acl_users(node.device(g0)) == set()
    assert sorted(kind for kind, _ in node.events) == ["power_capped", "revoked"]


def test_a_card_is_only_changed_when_its_state_must_change(node, unix_users):
    g0, _ = node.gpus
    node.enforcer.offer(node.snapshot([lease(1, unix_users[0].name, [g0], T1, T2)], pct=40))

    for _ in range(5):
        node.enforcer.converge(T0)
        node.enforcer.reconcile(T0)
    assert len(node.sets) == 2  # each card capped once
    for _ in range(5):
        node.enforcer.converge(T1)
        node.enforcer.reconcile(T1)

    assert node.sets == [(g0, 160.0), (node.gpus[1], 160.0), (g0, DEFAULT_W)]


def test_a_card_whose_mig_slice_is_leased_is_not_capped(make_node, unix_users):
    node = make_node(SIMULATED_MIG="0:3g.40gb,2g.20gb,2g.20gb")
    _, whole = node.gpus
    (mig,) = node.backend.mig_cards()
    slice_uuid = mig.slices[0].uuid
    node.enforcer.offer(node.snapshot([lease(1, unix_users[0].name, [slice_uuid], T0, T1)], pct=50))

    node.enforcer.converge(T0)

    assert node.limits() == [DEFAULT_W, 200.0]
    assert node.sets == [(whole, 200.0)]
    node.enforcer.converge(T1)  # the slice's lease ended: the card is idle now
    assert node.limits() == [200.0, 200.0]


def test_turning_the_cap_off_gives_every_card_its_limit_back(node):
    node.enforcer.offer(node.snapshot([], version=1, pct=40))
    node.enforcer.converge(T0)
    node.events.clear()

    node.enforcer.offer(node.snapshot([], version=2, pct=None))
    node.enforcer.converge(T0)

    assert node.limits() == [DEFAULT_W, DEFAULT_W]
    assert [(kind, fields["message"]) for kind, fields in node.power_events()] == [
        ("power_restored", "power limit 160 W -> 400 W: the idle power cap is off")
    ] * 2


def test_a_new_percentage_moves_the_cap_and_off_still_gives_back_the_first_limit(node):
    node.enforcer.offer(node.snapshot([], version=1, pct=40))
    node.enforcer.converge(T0)
    node.enforcer.offer(node.snapshot([], version=2, pct=60))
    node.enforcer.converge(T0)
    assert node.limits() == [240.0, 240.0]

    node.enforcer.offer(node.snapshot([], version=3, pct=None))
    node.enforcer.converge(T0)

    assert node.limits() == [DEFAULT_W, DEFAULT_W]


def test_the_cap_stays_within_the_cards_range(node):
    node.enforcer.offer(node.snapshot([], pct=10))  # 40 W: below what the card accepts

    node.enforcer.converge(T0)

    assert node.limits() == [MIN_W, MIN_W]


def test_a_node_that_refuses_power_caps_changes_nothing_and_says_so_once(make_node):
    node = make_node(ALLOW_POWER_CAP="false")
    node.enforcer.offer(node.snapshot([], pct=40))

    for _ in range(3):
        node.enforcer.converge(T0)
        node.enforcer.reconcile(T0)

    assert node.sets == []
    assert node.limits() == [DEFAULT_W, DEFAULT_W]
    assert node.power_events() == [
        (
            "power_failed",
            {
                "message": "the portal asks for an idle power cap of 40 % of each card's default limit; this node's "
                "ALLOW_POWER_CAP=false refuses it: no power limit is changed"
            },
        )
    ]


# -- what the agent leaves alone, and failures -----------------------------------------------------------------


def test_a_failing_give_back_never_holds_up_a_grant_is_reported_once_and_tried_again_at_the_reconcile(
    node, unix_users, monkeypatch
):
    a = unix_users[0].name
    g0, _ = node.gpus
    node.enforcer.offer(node.snapshot([lease(1, a, [g0], T1, T2)], pct=40))
    node.enforcer.converge(T0)
    working_set = node.backend.set_power_limit

    def refused(uuid: str, watts: float) -> None:
        raise PowerLimitError("NVML refused the power limit 400 W: changing a power limit needs root (NO_PERMISSION)")

    monkeypatch.setattr(node.backend, "set_power_limit", refused)
    node.events.clear()

    for _ in range(3):
        node.enforcer.converge(T1)
        node.enforcer.reconcile(T1)

    assert acl_users(node.device(g0)) == {a}  # granted all the same
    assert node.limit(g0) == 160.0
    assert node.power_events() == [
        (
            "power_failed",
            {
                "gpu": g0,
                "power_limit_w": DEFAULT_W,
                "message": "NVML refused the power limit 400 W: changing a power limit needs root (NO_PERMISSION)",
            },
        )
    ]

    monkeypatch.setattr(node.backend, "set_power_limit", working_set)  # root again, say
    node.enforcer.reconcile(T1)

    assert node.limit(g0) == DEFAULT_W
    assert node.power_events()[-1][0] == "power_restored"


def test_a_card_without_power_limits_is_reported_once_and_the_others_capped(node, monkeypatch):
    g0, g1 = node.gpus
    readable = node.backend.power_limits
    reads: list[str] = []

    def limits(uuid: str) -> Any:
        reads.append(uuid)
        if uuid == g0:
            raise PowerLimitError("NVML cannot read the card's power limits: the card does not support power limits")
        return readable(uuid)

    monkeypatch.setattr(node.backend, "power_limits", limits)
    node.enforcer.offer(node.snapshot([], pct=40))

    for _ in range(3):
        for _ in range(10):
            node.enforcer.converge(T0)
        node.enforcer.reconcile(T0)

    assert node.sets == [(g1, 160.0)]
    assert reads.count(g0) == 4  # once, then once per reconcile: never at every pass
    assert [(kind, fields.get("gpu")) for kind, fields in node.power_events()] == [
        ("power_failed", g0),
        ("power_capped", g1),
    ]


def test_a_limit_set_on_the_node_is_the_nodes_and_a_driver_reload_is_capped_again(node, unix_users):
    a = unix_users[0].name
    g0, _ = node.gpus
    node.enforcer.offer(node.snapshot([lease(1, a, [g0], T1, T2)], pct=40))
    node.enforcer.converge(T0)

    node.backend.set_power_limit(g0, DEFAULT_W)  # a driver reload: the default again
    node.enforcer.reconcile(T0)
    assert node.limit(g0) == 160.0  # idle: capped again

    node.backend.set_power_limit(g0, 120.0)  # root's nvidia-smi -pl 120, below the cap
    node.enforcer.reconcile(T0)
    assert node.limit(g0) == 120.0  # a cap only ever lowers
    node.events.clear()

    node.enforcer.converge(T1)

    assert node.limit(g0) == 120.0  # not the agent's cap: not the agent's to give back
    assert node.power_events() == []
    assert acl_users(node.device(g0)) == {a}


def test_after_a_crash_the_caps_the_stored_policy_set_are_known_and_given_back(node, unix_users):
    a = unix_users[0].name
    g0, _ = node.gpus
    node.enforcer.offer(node.snapshot([lease(1, a, [g0], T1, T2)], version=1, pct=40))
    node.enforcer.converge(T0)
    node.clock.now = T1  # the agent was killed (no clean stop) and starts again in a's slot
    node.events.clear()

    restarted = node.new_enforcer()
    restarted.startup()

    assert node.limits() == [DEFAULT_W, 160.0]  # g0 back for the lease; g1 still capped, not capped twice
    assert [kind for kind, _ in node.power_events()] == ["power_restored"]
    restarted.offer(node.snapshot([lease(1, a, [g0], T1, T2)], version=2, pct=None))
    restarted.converge(T1)
    assert node.limits() == [DEFAULT_W, DEFAULT_W]


def test_a_clean_stop_gives_every_card_its_limit_back(node):
    node.enforcer.offer(node.snapshot([], pct=40))
    node.enforcer.converge(T0)

    node.enforcer.restore_power()

    assert node.limits() == [DEFAULT_W, DEFAULT_W]
    assert [fields["message"] for _, fields in node.power_events()][-2:] == [
        "power limit 160 W -> 400 W: the agent stops"
    ] * 2


# -- the simulated cards ------------------------------------------------------------------------------------


def test_a_simulated_card_never_draws_more_than_its_limit_and_reports_it(tmp_path):
    backend = SimulatedBackend(device_dir=str(tmp_path), node_name="gpu-demo", count=1, power_w=DEFAULT_W)
    (gpu,) = backend.gpus()
    with open(backend.device_path(gpu.uuid), "rb"):  # a job on the card: this process holds its file
        busy = backend.sample()[0]
        backend.set_power_limit(gpu.uuid, 150.0)
        capped = backend.sample()[0]

    assert busy.power_w is not None and busy.power_w > 150.0
    assert busy.power_limit_w == DEFAULT_W
    assert (capped.power_w, capped.power_limit_w) == (150.0, 150.0)
    assert capped.as_dict()["power_limit_w"] == 150.0
    assert backend.power_limits(gpu.uuid) == type(backend.power_limits(gpu.uuid))(
        min_w=MIN_W, max_w=DEFAULT_W, default_w=DEFAULT_W, current_w=150.0
    )
    with pytest.raises(PowerLimitError, match="outside the card's range"):
        backend.set_power_limit(gpu.uuid, 50.0)
