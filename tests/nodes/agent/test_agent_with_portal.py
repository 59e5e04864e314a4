"""The whole path: a booking changes in the portal, its worker pushes the node's state over the real
broker, the real agent opens or closes the GPU, and its reports land in the portal's database."""

from __future__ import annotations

from datetime import timedelta

import pytest
from celery.contrib.testing.worker import start_worker
from django.conf import settings
from django.db import connection
from django.utils import timezone

from nodes.agent.gpus.simulated import simulated_uuid
from nodes.models import AgentState, Gpu, GpuTelemetry, NodeEvent
from nodes.pushes import request_push
from nodes.services import node_register
from portal.celery import app
from reservations.models import Allocation, Reservation
from reservations.services import reservation_release
from tests.factories import UserFactory
from tests.nodes.agent.harness import AgentRun, acl_users, wait_for
from tests.nodes.queues import purge


# Three threads write at once here (the test, the live server taking reports, the worker); SQLite's
# shared in-memory test database answers "table is locked" to that, so this runs on PostgreSQL.
@pytest.mark.postgres_only
@pytest.mark.skipif(connection.vendor != "postgresql", reason="needs PostgreSQL")
@pytest.mark.django_db(transaction=True)
def test_a_booking_opens_the_gpu_on_its_node_and_a_release_closes_it(live_server, unix_users):
    person = unix_users[0]
    user = UserFactory(username="dana", unix_username=person.name)
    credentials = node_register(name="e2e-node", hostname="e2e.lab")
    node = credentials.node
    gpus = [
        Gpu.objects.create(node=node, index=i, uuid=simulated_uuid(node.name, i), model="Simulated", memory_mib=24576)
        for i in range(2)
    ]
    purge("celery", "node.e2e-node")
    agent = AgentRun(
        broker_url=settings.CELERY_BROKER_URL,
        portal_url=live_server.url,
        node_name=node.name,
        secret=credentials.lease_secret,
        token=credentials.agent_token,
    )
    try:
        agent.start()
        with start_worker(app, pool="solo", perform_ping_check=False, shutdown_timeout=10):
            # A slot running now (written directly: the booking rules forbid starting in the past).
            now = timezone.now()
            booking = Reservation.objects.create(
                user=user,
                node=node,
                start=now - timedelta(minutes=1),
                end=now + timedelta(hours=1),
                status=Reservation.Status.APPROVED,
                created_by=user,
            )
            Allocation.objects.create(reservation=booking, gpu=gpus[1], start=booking.start, end=booking.end)
            request_push(node.pk)
            assert wait_for(lambda: person.name in acl_users(agent.device(1)), timeout=15), "\n".join(agent.log)
            assert acl_users(agent.device(0)) == set()

            reservation_release(reservation=booking, actor=user)  # pushes after its commit
            assert wait_for(lambda: person.name not in acl_users(agent.device(1)), timeout=15)

        def reported() -> bool:
            kinds = set(NodeEvent.objects.filter(node=node).values_list("kind", flat=True))
            return {"granted", "revoked"} <= kinds and GpuTelemetry.objects.filter(gpu__node=node).count() == 2

        assert wait_for(reported, timeout=15, interval=0.2), "\n".join(agent.log)
        assert wait_for(lambda: AgentState.objects.filter(node=node, applied_version__gte=2).exists(), 15, 0.2)
        granted = NodeEvent.objects.get(node=node, kind="granted")
        assert (granted.gpu, granted.user, granted.reservation_id) == (gpus[1], person.name, booking.pk)
    finally:
        agent.cleanup()
        purge("celery", "node.e2e-node")
