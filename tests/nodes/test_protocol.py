"""The portal's side of the wire protocol (gpubook_agent/protocol.py): its serializers and URLs name the
same fields and paths, and what the agent builds within the protocol's limits is what the portal accepts."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import get_type_hints

import pytest
from django.urls import reverse

from gpubook_agent import protocol
from gpubook_agent.gpus.simulated import SimulatedBackend
from nodes.ingest_serializers import (
    EventSerializer,
    EventsSerializer,
    HeartbeatResponseSerializer,
    HeartbeatSerializer,
    LaunchStatusSerializer,
    MigCardSerializer,
    MigSliceSerializer,
    ProcessSerializer,
    SampleSerializer,
    TelemetrySerializer,
)
from nodes.models import NodeEvent
from reservations.lease_api import AgentLaunchSerializer, AgentLeaseSerializer, AgentSnapshotSerializer

T0 = datetime(2030, 5, 6, 9, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("serializer", "shape"),
    [
        (HeartbeatSerializer, protocol.Heartbeat),
        (HeartbeatResponseSerializer, protocol.HeartbeatReply),
        (TelemetrySerializer, protocol.Telemetry),
        (SampleSerializer, protocol.GpuReading),
        (ProcessSerializer, protocol.ProcessReading),
        (EventSerializer, protocol.Event),
        (AgentSnapshotSerializer, protocol.Snapshot),
        (AgentLeaseSerializer, protocol.Lease),
        (MigCardSerializer, protocol.MigCard),
        (MigSliceSerializer, protocol.MigSlice),
    ],
)
def test_each_serializer_has_the_fields_of_its_protocol_shape(serializer, shape):
    assert set(serializer().fields) == set(get_type_hints(shape))


def test_the_portal_stores_every_kind_of_event_an_agent_reports():
    assert set(protocol.EVENT_KINDS) == set(NodeEvent.Kind.values)


@pytest.mark.parametrize("endpoint", [protocol.HEARTBEAT, protocol.EVENTS, protocol.TELEMETRY, protocol.SNAPSHOT])
def test_the_agent_endpoints_are_where_the_protocol_says(endpoint):
    assert reverse(f"api:agent-{endpoint}") == protocol.agent_path(endpoint)


def test_a_heartbeat_the_agent_builds_is_valid():
    body = protocol.heartbeat(
        backend="nvml", driver_version="550.54", applied_version=3, acls={"GPU-1": ["alice"]}, drained=["GPU-1"]
    )

    serializer = HeartbeatSerializer(data=body)

    assert serializer.is_valid(), serializer.errors


def test_a_heartbeat_with_the_mig_layout_the_simulated_agent_reports_is_valid(tmp_path):
    backend = SimulatedBackend(
        device_dir=str(tmp_path / "dev"),
        node_name="gpu-a100",
        count=2,
        memory_mib=81920,
        mig_layout="0:3g.40gb,2g.20gb,2g.20gb;1:1g.10gb,1g.10gb,1g.10gb,1g.10gb,1g.10gb,1g.10gb,1g.10gb",
    )
    body = protocol.heartbeat(
        backend="simulated",
        driver_version="simulated",
        applied_version=3,
        acls={},
        mig=[card.as_dict() for card in backend.mig_cards()],
    )

    serializer = HeartbeatSerializer(data=body)

    assert serializer.is_valid(), serializer.errors
    assert [len(card["slices"]) for card in serializer.validated_data["mig"]] == [3, 7]


def test_an_event_cut_to_the_protocols_limits_is_valid():
    fields = {
        "gpu": "GPU-1",
        "user": "u" * 100,
        "pids": list(range(1, 5000)),
        "message": "m" * 9000,
        "process": "p" * 99,
    }
    event = protocol.event("leftover", fields, at=T0)

    serializer = EventSerializer(data=event)

    assert serializer.is_valid(), serializer.errors


def test_a_full_batch_of_events_is_valid():
    batch = [
        protocol.event("granted", {"gpu": "GPU-1", "user": "alice"}, at=T0) for _ in range(protocol.EVENTS_PER_POST)
    ]

    assert EventsSerializer(data=protocol.events(batch)).is_valid()


def test_the_launch_shapes_have_their_serializers_fields():
    assert set(LaunchStatusSerializer().fields) == set(get_type_hints(protocol.LaunchStatus))
    assert set(AgentLaunchSerializer().fields) == set(get_type_hints(protocol.LaunchRequest))
