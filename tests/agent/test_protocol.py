"""The wire protocol's builders, as the agent uses them (tests/nodes/test_protocol.py holds the portal to them)."""

from __future__ import annotations

import json
import socket
from datetime import UTC, datetime, timedelta

from gpubook_agent import AGENT_VERSION, protocol
from gpubook_agent.signing import signed
from gpubook_agent.snapshot import decode_snapshot, parse_snapshot

T0 = datetime(2030, 5, 6, 9, 0, tzinfo=UTC)
SECRET = "s" * 64


def test_a_heartbeat_names_this_agent_and_what_it_enforces():
    body = protocol.heartbeat(
        backend="nvml",
        driver_version="550.54",
        applied_version=12,
        acls={"GPU-1": ["alice"]},
        drained={"GPU-2", "GPU-1"},
        sent_at=T0,
    )

    assert body == {
        "sent_at": "2030-05-06T09:00:00+00:00",
        "agent_version": AGENT_VERSION,
        "backend": "nvml",
        "driver_version": "550.54",
        "hostname": socket.gethostname(),
        "applied_version": 12,
        "acls": {"GPU-1": ["alice"]},
        "drained": ["GPU-1", "GPU-2"],
    }


def test_a_heartbeat_without_drained_gpus_leaves_the_field_out():
    body = protocol.heartbeat(backend="simulated", driver_version=None, applied_version=0, acls={})

    assert "drained" not in body
    assert datetime.fromisoformat(body["sent_at"]).tzinfo is not None


def test_a_heartbeat_carries_the_mig_layout_with_each_cards_slices_in_placement_order():
    second = protocol.mig_slice(
        uuid="MIG-2",
        profile="3g.40gb",
        gpu_instance_id=1,
        compute_instance_id=0,
        placement_start=4,
        placement_size=4,
        compute_slices=3,
        memory_mib=40960,
    )
    first = {**second, "uuid": "MIG-1", "profile": "2g.20gb", "gpu_instance_id": 2, "placement_start": 0}
    card = protocol.mig_card(
        uuid="GPU-1", mode_current=True, mode_pending=False, placement_slots=8, compute_slices=7, slices=[second, first]
    )

    body = protocol.heartbeat(backend="nvml", driver_version=None, applied_version=1, acls={}, mig=[card], sent_at=T0)

    assert body["mig"] == [
        {
            "uuid": "GPU-1",
            "mode_current": True,
            "mode_pending": False,
            "placement_slots": 8,
            "compute_slices": 7,
            "slices": [first, second],
        }
    ]
    assert json.loads(json.dumps(body)) == body
    assert "mig" not in protocol.heartbeat(backend="nvml", driver_version=None, applied_version=1, acls={})


def test_an_event_drops_empty_fields_and_keeps_within_the_portals_limits():
    fields = {"gpu": "GPU-1", "user": "u" * 40, "pids": list(range(1, 2000)), "message": "m" * 3000, "process": None}

    event = protocol.event("leftover", fields, at=T0)

    assert event["kind"] == "leftover" and event["at"] == "2030-05-06T09:00:00+00:00"
    assert "process" not in event
    assert event["pids"] == list(range(1, protocol.MAX_PIDS + 1))
    assert event["user"] == "u" * 31 + "…"
    assert event["message"] == "m" * 1999 + "…"


def test_telemetry_and_events_wrap_their_items():
    assert protocol.telemetry([], sent_at=T0) == {"sent_at": "2030-05-06T09:00:00+00:00", "gpus": []}
    assert protocol.events([{"kind": "granted"}]) == {"events": [{"kind": "granted"}]}


def test_a_snapshot_built_and_sent_as_the_portal_does_is_one_the_agent_accepts():
    lease = protocol.lease(reservation=7, user="alice", gpus=("GPU-0123abcd",), start=T0, end=T0 + timedelta(hours=1))
    snapshot = protocol.snapshot(
        node="gpu-a100", version=3, issued_at=T0, horizon_end=T0 + timedelta(hours=24), leases=[lease]
    )

    message = protocol.snapshot_message(signed(snapshot, SECRET))
    parsed = parse_snapshot(decode_snapshot(message), node_name="gpu-a100", secret=SECRET)

    assert " " not in message and json.loads(message)["leases"] == [lease]
    assert (parsed.version, parsed.leases[0].user, parsed.leases[0].gpus) == (3, "alice", ("GPU-0123abcd",))


def test_the_queue_and_the_paths_are_named_once():
    assert protocol.queue_name("gpu-a100") == "node.gpu-a100"
    assert protocol.agent_path(protocol.HEARTBEAT) == "/api/v1/agent/heartbeat/"
    assert protocol.agent_path(protocol.SNAPSHOT) == "/api/v1/agent/snapshot/"
