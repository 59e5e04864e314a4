"""The endpoints agents report to: only a node's own token, only that node's GPUs, strict input."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from nodes.models import AgentState, Gpu, GpuTelemetry, NodeEvent
from nodes.reports import gpu_return_to_service
from nodes.services import node_rotate_credentials
from nodes.status import node_online
from reservations.exceptions import InvalidBooking
from reservations.services import reservation_create
from tests.api_helpers import client_for
from tests.factories import node_with_gpus

HEARTBEAT = "/api/v1/agent/heartbeat/"
EVENTS = "/api/v1/agent/events/"
TELEMETRY = "/api/v1/agent/telemetry/"


def agent_client(node) -> APIClient:
    credentials = node_rotate_credentials(node=node)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {credentials.agent_token}")
    return client


def heartbeat(**overrides):
    return {
        "sent_at": timezone.now().isoformat(),
        "agent_version": "0.1.0",
        "backend": "simulated",
        "driver_version": "simulated",
        "hostname": "a100.lab",
        "applied_version": 7,
        "acls": {},
        "drained": [],
        **overrides,
    }


def sample(uuid, **overrides):
    return {
        "uuid": uuid,
        "utilization_pct": 87,
        "memory_used_mib": 2048,
        "memory_total_mib": 24576,
        "temperature_c": 61,
        "slowdown_temperature_c": 90,
        "power_w": 250.5,
        "ecc_errors_uncorrected": 0,
        "processes": [{"pid": 4242, "user": "alice", "used_memory_mib": 1024}],
        "missing": [],
        **overrides,
    }


@pytest.fixture
def other_node(db):
    return node_with_gpus(2, name="gpu-4090")


def test_a_heartbeat_records_the_agent_state_and_answers_the_portal_version(node, gpus):
    client = agent_client(node)
    response = client.post(HEARTBEAT, heartbeat(acls={gpus[0].uuid: ["alice"]}), format="json")

    assert response.status_code == 200, response.json()
    assert response.json()["lease_version"] == node.lease_version
    state = AgentState.objects.get(node=node)
    assert state.applied_version == 7
    assert state.acls == {gpus[0].uuid: ["alice"]}
    assert abs(state.clock_skew_seconds) < 60
    assert node_online(state, timezone.now())
    assert not node_online(state, timezone.now() + timedelta(seconds=41))


def test_a_node_reports_only_for_itself(node, gpus, other_node):
    foreign = other_node.gpus.first()
    client = agent_client(node)

    response = client.post(
        TELEMETRY,
        {"sent_at": timezone.now().isoformat(), "gpus": [sample(gpus[0].uuid), sample(foreign.uuid)]},
        format="json",
    )
    assert response.status_code == 200
    assert response.json() == {"stored": 1, "ignored_gpus": [foreign.uuid]}
    assert GpuTelemetry.objects.filter(gpu=gpus[0], utilization_pct=87).exists()
    assert not GpuTelemetry.objects.filter(gpu=foreign).exists()

    event = {"kind": "unkillable", "at": timezone.now().isoformat(), "gpu": foreign.uuid, "user": "bob", "pids": [9]}
    response = client.post(EVENTS, {"events": [event]}, format="json")
    assert response.json()["ignored_gpus"] == [foreign.uuid]
    foreign.refresh_from_db()
    assert foreign.drained_at is None  # another node's GPU is never touched
    assert NodeEvent.objects.get().node == node


def test_telemetry_keeps_the_latest_reading_and_missing_fields_as_null(node, gpus):
    client = agent_client(node)
    client.post(TELEMETRY, {"sent_at": timezone.now().isoformat(), "gpus": [sample(gpus[0].uuid)]}, format="json")
    reading = sample(gpus[0].uuid, power_w=None, ecc_errors_uncorrected=None, utilization_pct=3, missing=["power_w"])
    response = client.post(TELEMETRY, {"sent_at": timezone.now().isoformat(), "gpus": [reading]}, format="json")

    assert response.status_code == 200
    latest = GpuTelemetry.objects.get(gpu=gpus[0])
    assert (latest.utilization_pct, latest.power_w, latest.processes[0]["user"]) == (3, None, "alice")


@pytest.mark.parametrize(
    ("endpoint", "body", "field"),
    [
        (HEARTBEAT, heartbeat(sent_at="2030-01-07T09:00:00"), "sent_at"),
        (HEARTBEAT, heartbeat(backend="dcgm"), "backend"),
        (HEARTBEAT, heartbeat(applied_version=-1), "applied_version"),
        (EVENTS, {"events": [{"kind": "made_up", "at": "2030-01-07T09:00:00Z"}]}, "events"),
        (EVENTS, {"events": [{"kind": "granted", "at": "2030-01-07T09:00:00Z"}] * 501}, "events"),
        (TELEMETRY, {"sent_at": "2030-01-07T09:00:00Z", "gpus": [sample("GPU-x", utilization_pct=101)]}, "gpus"),
        (TELEMETRY, {"sent_at": "2030-01-07T09:00:00Z", "gpus": "all"}, "gpus"),
    ],
)
def test_bad_reports_are_refused_with_the_field_named_and_nothing_stored(node, endpoint, body, field):
    response = agent_client(node).post(endpoint, body, format="json")

    assert response.status_code == 400
    assert field in response.json()["error"]["details"]["fields"]
    assert not AgentState.objects.exists() and not NodeEvent.objects.exists() and not GpuTelemetry.objects.exists()


def test_only_a_current_node_token_is_accepted(node, alice):
    old = agent_client(node)
    new = agent_client(node)  # rotating the credentials invalidates the first token

    assert old.post(HEARTBEAT, heartbeat(), format="json").status_code == 401
    assert new.post(HEARTBEAT, heartbeat(), format="json").status_code == 200
    assert APIClient().post(HEARTBEAT, heartbeat(), format="json").status_code == 401
    user_token = client_for(alice).post(HEARTBEAT, heartbeat(), format="json")
    assert user_token.status_code == 401
    assert "node agent token" in user_token.json()["error"]["message"]
    # ...and a node token opens nothing else in the API.
    assert new.get("/api/v1/gpus/").status_code == 401


def test_an_unkillable_leftover_drains_the_gpu_until_an_admin_returns_it(node, gpus, alice, carol, clock):
    event = {"kind": "unkillable", "at": timezone.now().isoformat(), "gpu": gpus[1].uuid, "user": "bob", "pids": [77]}
    response = agent_client(node).post(EVENTS, {"events": [event]}, format="json")
    assert response.json() == {"stored": 1, "ignored_gpus": []}

    drained = Gpu.objects.get(pk=gpus[1].pk)
    assert drained.drained_at is not None and "bob" in drained.drain_reason and "77" in drained.drain_reason
    start = timezone.now() + timedelta(hours=1)
    with pytest.raises(InvalidBooking, match="cannot be booked"):
        reservation_create(user=alice, gpus=[drained], start=start, end=start + timedelta(hours=1))

    assert gpu_return_to_service(gpu=drained, actor=carol)
    drained.refresh_from_db()
    assert reservation_create(user=alice, gpus=[drained], start=start, end=start + timedelta(hours=1)).pk
