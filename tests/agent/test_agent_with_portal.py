"""The whole path: a booking changes in the portal, its worker pushes the node's state over the real
broker, the real agent opens or closes the GPU, and its reports land in the portal's database."""

# Tests run fixed argument lists (never a shell).
# ruff: noqa: S603, S607

from __future__ import annotations

import base64
import json
import os
import pwd
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
import redis
from celery.contrib.testing.worker import start_worker
from django.conf import settings
from django.db import connection
from django.utils import timezone

from accounts.models import User
from accounts.services import user_deactivate
from alerts.models import Alert
from gpubook_agent.gpus.simulated import simulated_uuid
from nodes.models import AgentState, Gpu, GpuTelemetry, Node, NodeEvent
from nodes.services import node_register
from portal.celery import app
from reservations.models import Allocation, Reservation
from reservations.pushes import request_push
from reservations.services import reservation_cancel, reservation_release
from tests.agent.conftest import CHILD_ENV, SETUID_HOLDER, start_ready
from tests.agent.harness import AgentRun, acl_users, wait_for
from tests.factories import UserFactory
from tests.nodes.queues import purge

# Three threads write at once here (the test, the live server taking reports, the worker); SQLite's
# shared in-memory test database answers "table is locked" to that, so this runs on PostgreSQL.
pytestmark = [
    pytest.mark.postgres_only,
    pytest.mark.skipif(connection.vendor != "postgresql", reason="needs PostgreSQL"),
    pytest.mark.django_db(transaction=True),
]


HEARTBEAT = 1.0  # the agent's HEARTBEAT_SECONDS in these tests (tests/agent/harness.py)
PULL_AFTER = 3.0  # its PULL_AFTER_SECONDS


@dataclass
class Lab:
    node: Node
    gpus: list[Gpu]
    agent: AgentRun

    def running_booking(self, user: User, gpu: int) -> Reservation:
        """A slot running now (written directly: the booking rules forbid starting in the past)."""
        now = timezone.now()
        booking = Reservation.objects.create(
            user=user,
            node=self.node,
            start=now - timedelta(minutes=1),
            end=now + timedelta(hours=1),
            status=Reservation.Status.APPROVED,
            created_by=user,
        )
        Allocation.objects.create(reservation=booking, gpu=self.gpus[gpu], start=booking.start, end=booking.end)
        request_push(self.node.pk)
        return booking


@pytest.fixture
def lab(live_server) -> Iterator[Lab]:
    """A registered three-GPU node with its real agent reporting to the live portal, and a worker."""
    credentials = node_register(name="e2e-node", hostname="e2e.lab")
    node = credentials.node
    gpus = [
        Gpu.objects.create(node=node, index=i, uuid=simulated_uuid(node.name, i), model="Simulated", memory_mib=24576)
        for i in range(3)
    ]
    purge("celery", "node.e2e-node")
    agent = AgentRun(
        broker_url=settings.CELERY_BROKER_URL,
        portal_url=live_server.url,
        node_name=node.name,
        secret=credentials.lease_secret,
        token=credentials.agent_token,
        gpus=3,
        pull_after_seconds=PULL_AFTER,
    )
    try:
        agent.start()
        with start_worker(app, pool="solo", perform_ping_check=False, shutdown_timeout=10):
            yield Lab(node, gpus, agent)
    finally:
        agent.cleanup()
        purge("celery", "node.e2e-node")


def test_a_booking_opens_the_gpu_on_its_node_and_a_release_closes_it(lab, unix_users):
    person = unix_users[0]
    user = UserFactory(username="dana", unix_username=person.name)
    agent = lab.agent

    booking = lab.running_booking(user, 1)
    assert wait_for(lambda: person.name in acl_users(agent.device(1)), timeout=15), "\n".join(agent.log)
    assert acl_users(agent.device(0)) == set()

    reservation_release(reservation=booking, actor=user)  # pushes after its commit
    assert wait_for(lambda: person.name not in acl_users(agent.device(1)), timeout=15)

    def reported() -> bool:
        kinds = set(NodeEvent.objects.filter(node=lab.node).values_list("kind", flat=True))
        return {"granted", "revoked"} <= kinds and GpuTelemetry.objects.filter(gpu__node=lab.node).count() == 3

    assert wait_for(reported, timeout=15, interval=0.2), "\n".join(agent.log)
    assert wait_for(lambda: AgentState.objects.filter(node=lab.node, applied_version__gte=2).exists(), 15, 0.2)
    granted = NodeEvent.objects.get(node=lab.node, kind="granted")
    assert (granted.gpu, granted.user, granted.reservation_id) == (lab.gpus[1], person.name, booking.pk)
    # The simulated cards' energy counters arrive with their readings, measured (not estimated).
    assert not GpuTelemetry.objects.filter(gpu__node=lab.node, energy_mj=None).exists()
    assert not GpuTelemetry.objects.filter(gpu__node=lab.node, energy_estimated=True).exists()


def test_deactivating_a_person_closes_their_gpu_within_seconds(lab, unix_users):
    person = unix_users[0]
    user = UserFactory(username="dana", unix_username=person.name)
    booking = lab.running_booking(user, 0)
    assert wait_for(lambda: person.name in acl_users(lab.agent.device(0)), timeout=15), "\n".join(lab.agent.log)

    user_deactivate(user=user, actor=None, reason="left the lab")

    assert wait_for(lambda: person.name not in acl_users(lab.agent.device(0)), timeout=10), "\n".join(lab.agent.log)
    booking.refresh_from_db()
    assert booking.released_at is not None
    assert booking.end <= timezone.now()


@pytest.fixture
def system_account() -> Iterator[pwd.struct_passwd]:
    """A throwaway system account (a uid below UID_MIN, as `useradd --system` picks)."""
    if os.geteuid() != 0:
        pytest.skip("needs root: creates an account")
    name = f"gpbt_sys{secrets.token_hex(3)}"
    subprocess.run(
        ["useradd", "--system", "-M", "-N", "-s", "/usr/sbin/nologin", name], check=True, capture_output=True
    )
    try:
        entry = pwd.getpwnam(name)
        assert entry.pw_uid < 1000
        yield entry
    finally:
        subprocess.run(["userdel", name], check=False, capture_output=True)


def test_the_node_refuses_system_accounts_and_the_portal_alerts_naming_them(lab, unix_users, system_account):
    """As a careless admin would leave it: www-data and a uid-999-style system account as people's
    unix usernames (written directly; the portal's deny list would refuse www-data). The node grants
    neither, enforces the rest of the snapshot, and every refusal becomes an alert for the admins."""
    person = unix_users[0]
    web = UserFactory(username="webby", unix_username="x")
    User.objects.filter(pk=web.pk).update(unix_username="www-data")
    daemon = UserFactory(username="sysop", unix_username=system_account.pw_name)
    honest = UserFactory(username="dana", unix_username=person.name)
    lab.running_booking(web, 0)
    lab.running_booking(daemon, 1)
    lab.running_booking(honest, 2)

    assert wait_for(lambda: person.name in acl_users(lab.agent.device(2)), timeout=15), "\n".join(lab.agent.log)

    def alerted() -> set[tuple[str, str, int | None]]:
        alerts = Alert.objects.filter(kind=Alert.Kind.ACCOUNT_REFUSED, node=lab.node, resolved_at__isnull=True)
        return set(alerts.values_list("username", "node__name", "user_id"))

    expected = {("www-data", "e2e-node", web.pk), (system_account.pw_name, "e2e-node", daemon.pk)}
    assert wait_for(lambda: alerted() == expected, timeout=15, interval=0.2), (alerted(), "\n".join(lab.agent.log))
    assert acl_users(lab.agent.device(0)) == set()
    assert acl_users(lab.agent.device(1)) == set()
    assert acl_users(lab.agent.device(2)) == {person.name}
    refusal = NodeEvent.objects.get(node=lab.node, kind="lease_refused", user="www-data")
    assert "system account on this node" in refusal.message


class QueueThief:
    """Someone holding the broker URL who takes the node's next snapshot off its queue before the agent
    can: what one node's credentials could do to another's pushes (issue 15). Redis hands a pushed
    element to the client that has been blocked in BRPOP the longest; the agent's consumer re-issues its
    BRPOP every second, so once its current wait began after the thief's, the thief is served first."""

    def __init__(self, queue: str) -> None:
        self.queue = queue
        self.redis = redis.Redis.from_url(settings.CELERY_BROKER_URL, single_connection_client=True)
        self.watcher = redis.Redis.from_url(settings.CELERY_BROKER_URL)
        self.id = self.redis.client_id()
        self.taken: Any = None
        self.thread = threading.Thread(target=self._take, daemon=True)

    def _take(self) -> None:
        self.taken = self.redis.brpop([self.queue], timeout=60)

    def lie_in_wait(self) -> None:
        """Start waiting, and return once every other waiting consumer of this database began its wait
        after the thief (CLIENT LIST: a smaller idle time, counted in whole seconds)."""
        self.thread.start()

        def first_in_line() -> bool:
            waiting = [c for c in self.watcher.client_list() if c["cmd"] == "brpop" and "b" in c["flags"]]
            mine = [c for c in waiting if int(c["id"]) == self.id]
            if not mine:
                return False
            others = [c for c in waiting if int(c["id"]) != self.id and c["db"] == mine[0]["db"]]
            return all(int(c["idle"]) < int(mine[0]["idle"]) for c in others)

        assert wait_for(first_in_line, timeout=15, interval=0.1), "the thief never got to the front"

    def snapshot(self) -> dict:
        """The snapshot in the message it took (the portal pushes it as one JSON string)."""
        self.thread.join(timeout=30)
        assert self.taken is not None, "the thief took nothing: the push reached the agent"
        message = json.loads(self.taken[1])
        args, _kwargs, _embed = json.loads(base64.b64decode(message["body"]))
        return json.loads(args[0])

    def close(self) -> None:
        self.redis.close()
        self.watcher.close()


def test_a_cancellation_whose_push_is_taken_off_the_queue_still_closes_the_gpu_through_the_pull(lab, unix_users, carol):
    """No beat runs here, so nothing re-pushes: only the pull can bring the cancellation to the node."""
    person = unix_users[0]
    user = UserFactory(username="dana", unix_username=person.name)
    booking = lab.running_booking(user, 1)
    assert wait_for(lambda: person.name in acl_users(lab.agent.device(1)), timeout=15), "\n".join(lab.agent.log)
    thief = QueueThief(lab.agent.queue)
    try:
        thief.lie_in_wait()
        cancelled = time.monotonic()

        reservation_cancel(reservation=booking, actor=carol, reason="hardware fault")  # pushes after commit

        lost = thief.snapshot()
    finally:
        thief.close()
    assert lost["leases"] == []  # that push carried the cancellation, and it is gone
    revoked = wait_for(
        lambda: person.name not in acl_users(lab.agent.device(1)), timeout=HEARTBEAT + PULL_AFTER + 5, interval=0.05
    )
    assert revoked is not None, "\n".join(lab.agent.log[-30:])
    assert revoked - cancelled <= HEARTBEAT + PULL_AFTER + 5
    # Closed by a snapshot newer than the stolen one: the pull's (nothing else was pushed).
    assert lab.agent.stored_snapshot()["version"] > lost["version"]
    assert any("pulling the snapshot" in line for line in lab.agent.log)


def test_a_holder_the_agent_may_not_signal_drains_the_gpu_and_alerts_the_admins_until_it_is_gone(
    lab, unix_users, started
):
    person = unix_users[0]
    user = UserFactory(username="dana", unix_username=person.name)
    booking = lab.running_booking(user, 2)
    assert wait_for(lambda: person.name in acl_users(lab.agent.device(2)), timeout=15), "\n".join(lab.agent.log)
    holder = start_ready(
        [sys.executable, "-I", "-c", SETUID_HOLDER, str(person.uid), str(person.gid), lab.agent.device(2)],
        started,
        cwd="/",
        env=CHILD_ENV,
    )

    reservation_release(reservation=booking, actor=user)  # after the grace, what dana left is ended: not this one

    def alerted() -> Alert | None:
        return Alert.objects.filter(kind=Alert.Kind.UNKILLABLE, gpu=lab.gpus[2], resolved_at=None).first()

    assert wait_for(alerted, timeout=20, interval=0.2), "\n".join(lab.agent.log)
    gpu = Gpu.objects.get(pk=lab.gpus[2].pk)
    assert gpu.drained_at is not None and f"pid {holder.pid} (su) of {person.name}" in gpu.drain_reason
    assert NodeEvent.objects.filter(node=lab.node, kind="unkillable").count() == 1
    assert holder.poll() is None

    holder.kill()  # an admin ends it
    holder.wait(timeout=10)
    assert wait_for(lambda: alerted() is None, timeout=20, interval=0.2)
    assert Gpu.objects.get(pk=lab.gpus[2].pk).drained_at is not None  # bookable again once an admin returns it
