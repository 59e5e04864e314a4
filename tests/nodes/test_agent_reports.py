"""The endpoints agents report to: only a node's own token, only that node's GPUs, strict input;
and the events' budget per node and minute, and how long they are kept."""

from __future__ import annotations

from datetime import timedelta
from unittest.mock import ANY

import pytest
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from alerts.models import Alert
from gpubook_agent import protocol
from nodes import ingest
from nodes.ingest import ACTING_PAST_BUDGET, agent_events_record, node_events_prune
from nodes.liveness import node_online
from nodes.models import AgentState, Gpu, GpuTelemetry, NodeEvent
from nodes.services import gpu_return_to_service, node_rotate_credentials
from reservations.exceptions import InvalidBooking
from reservations.fleet import fleet_status, for_viewer
from reservations.services import reservation_create
from tests.api_helpers import client_for
from tests.factories import node_with_gpus
from tests.metrics.conftest import TOKEN
from tests.metrics.conftest import value as metric_value

HEARTBEAT = "/api/v1/agent/heartbeat/"
EVENTS = "/api/v1/agent/events/"
TELEMETRY = "/api/v1/agent/telemetry/"


def agent_client(node) -> APIClient:
    credentials = node_rotate_credentials(node=node)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {credentials.agent_token}")
    return client


def heartbeat(**overrides):
    body = protocol.heartbeat(
        backend="simulated", driver_version="simulated", applied_version=7, acls={}, drained=[], sent_at=timezone.now()
    )
    return {**body, **overrides}


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


def test_telemetry_keeps_the_energy_counter_and_an_older_agent_without_one_stores_none(node, gpus):
    client = agent_client(node)
    measured = sample(gpus[0].uuid, energy_mj=5_400_000_000, energy_estimated=False)
    estimated = sample(gpus[1].uuid, energy_mj=12_345, energy_estimated=True)
    response = client.post(
        TELEMETRY, {"sent_at": timezone.now().isoformat(), "gpus": [measured, estimated]}, format="json"
    )
    assert response.status_code == 200, response.json()
    # An agent from before energy reporting sends neither field.
    client.post(TELEMETRY, {"sent_at": timezone.now().isoformat(), "gpus": [sample(gpus[2].uuid)]}, format="json")

    stored = {row.gpu_id: (row.energy_mj, row.energy_estimated) for row in GpuTelemetry.objects.all()}
    assert stored == {gpus[0].pk: (5_400_000_000, False), gpus[1].pk: (12_345, True), gpus[2].pk: (None, False)}


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
        (TELEMETRY, {"sent_at": "2030-01-07T09:00:00Z", "gpus": [sample("GPU-x", energy_mj=-1)]}, "gpus"),
        (TELEMETRY, {"sent_at": "2030-01-07T09:00:00Z", "gpus": [sample("GPU-x", energy_mj=2**63)]}, "gpus"),
        (TELEMETRY, {"sent_at": "2030-01-07T09:00:00Z", "gpus": [sample("GPU-x", energy_mj="lots")]}, "gpus"),
    ],
)
def test_bad_reports_are_refused_with_the_field_named_and_nothing_stored(node, endpoint, body, field):
    response = agent_client(node).post(endpoint, body, format="json")

    assert response.status_code == 400
    assert field in response.json()["error"]["details"]["fields"]
    assert not AgentState.objects.exists() and not NodeEvent.objects.exists() and not GpuTelemetry.objects.exists()


def test_each_report_is_validated_on_its_own_after_a_refused_one(node, gpus):
    """The endpoints validate with one serializer per process (nodes/agent_auth.py): nothing of one body's
    validation, its errors or its values, reaches the next body's."""
    client = agent_client(node)
    now = timezone.now().isoformat()

    refused = client.post(
        TELEMETRY, {"sent_at": now, "gpus": [sample(gpus[0].uuid, utilization_pct=101)]}, format="json"
    )
    stored = client.post(TELEMETRY, {"sent_at": now, "gpus": [sample(gpus[1].uuid, utilization_pct=5)]}, format="json")
    refused_again = client.post(TELEMETRY, {"sent_at": "yesterday", "gpus": [sample(gpus[0].uuid)]}, format="json")

    assert refused.status_code == 400
    assert refused.json()["error"]["details"]["fields"]["gpus"] == {"0": {"utilization_pct": [ANY]}}
    assert stored.status_code == 200, stored.json()
    assert stored.json() == {"stored": 1, "ignored_gpus": []}
    assert refused_again.status_code == 400
    assert set(refused_again.json()["error"]["details"]["fields"]) == {"sent_at"}
    assert list(GpuTelemetry.objects.values_list("gpu", "utilization_pct")) == [(gpus[1].pk, 5)]
    nothing = client.post(TELEMETRY, "null", content_type="application/json")
    assert nothing.status_code == 400
    assert nothing.json()["error"]["details"]["fields"] == {"non_field_errors": ["No data provided"]}


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


def test_an_unkillable_holder_run_as_root_drains_the_gpu_with_the_agents_words_and_opens_an_alert(node, gpus):
    message = (
        "pid 4242 (su) of bob runs with root's privileges (a set-user-ID program such as su holding the device "
        "open): the agent never signals root, so an admin must end it"
    )
    event = {
        "kind": "unkillable",
        "at": timezone.now().isoformat(),
        "gpu": gpus[2].uuid,
        "user": "bob",
        "pid": 4242,
        "pids": [4242],
        "process": "su",
        "message": message,
        "drained": True,
    }
    assert agent_client(node).post(EVENTS, {"events": [event]}, format="json").json()["stored"] == 1

    drained = Gpu.objects.get(pk=gpus[2].pk)
    assert drained.drained_at is not None and drained.drain_reason == message  # what the admin reads, and why
    (alert,) = Alert.objects.filter(kind=Alert.Kind.UNKILLABLE, resolved_at=None)
    assert alert.gpu_id == gpus[2].pk


# --- the event budget and retention ---------------------------------------------------------------


def revoked(count: int, **fields):
    """Events that only inform (no alert, no drain): the bulk of what agents send."""
    return [{"kind": "revoked", "at": timezone.now().isoformat(), "user": "alice", **fields}] * count


def post_events(client, events) -> dict:
    response = client.post(EVENTS, {"events": events}, format="json")
    assert response.status_code == 200, response.json()
    return response.json()


def test_events_past_the_budget_are_counted_not_stored_until_the_next_minute(node, gpus, clock, settings):
    settings.NODE_EVENTS_PER_MINUTE = 10
    client = agent_client(node)
    assert post_events(client, revoked(8))["stored"] == 8
    assert post_events(client, revoked(5))["stored"] == 2
    assert post_events(client, revoked(1))["stored"] == 0
    state = AgentState.objects.get(node=node)
    assert (state.events_dropped, state.events_dropped_at) == (4, timezone.now())
    assert NodeEvent.objects.count() == 10

    clock.shift(timedelta(seconds=60))  # a new minute, a new budget
    assert post_events(client, revoked(3))["stored"] == 3
    assert AgentState.objects.get(node=node).events_dropped == 4


def test_past_the_budget_the_events_that_act_still_drain_gpus_and_open_alerts(node, gpus, clock, settings):
    settings.NODE_EVENTS_PER_MINUTE = 5
    client = agent_client(node)
    post_events(client, revoked(5))
    now = timezone.now().isoformat()
    unkillable = {"kind": "unkillable", "at": now, "gpu": gpus[1].uuid, "user": "bob", "pids": [77]}
    violation = {"kind": "violation", "at": now, "gpu": gpus[0].uuid, "user": "mallory", "pid": 4}
    assert post_events(client, [*revoked(3), unkillable, violation, violation, violation])["stored"] == 0

    assert NodeEvent.objects.count() == 5 and AgentState.objects.get(node=node).events_dropped == 7
    assert Gpu.objects.get(pk=gpus[1].pk).drained_at is not None  # drained all the same
    alerts = Alert.objects.filter(resolved_at__isnull=True)
    assert sorted(alerts.values_list("kind", "username")) == [("unkillable", ""), ("violation", "mallory")]
    assert alerts.get(kind="violation").details["event"]["pid"] == 4


def test_a_report_over_the_budget_stores_the_events_that_act_first(node, gpus, settings):
    settings.NODE_EVENTS_PER_MINUTE = 3
    violation = {"kind": "violation", "at": timezone.now().isoformat(), "gpu": gpus[0].uuid, "user": "mallory"}
    assert post_events(agent_client(node), [*revoked(4), violation])["stored"] == 3
    assert sorted(NodeEvent.objects.values_list("kind", flat=True)) == ["revoked", "revoked", "violation"]


def test_a_flood_of_made_up_users_past_the_budget_acts_for_at_most_fifty(node, gpus, settings):
    settings.NODE_EVENTS_PER_MINUTE = 0
    at = timezone.now().isoformat()
    flood = [{"kind": "violation", "at": at, "gpu": gpus[0].uuid, "user": f"ghost{n}"} for n in range(500)]
    assert post_events(agent_client(node), flood)["stored"] == 0
    assert Alert.objects.filter(kind="violation").count() == ACTING_PAST_BUDGET == 50
    assert not NodeEvent.objects.exists() and AgentState.objects.get(node=node).events_dropped == 500


def test_events_before_any_heartbeat_count_against_the_budget_and_do_not_make_the_node_online(node, gpus):
    assert post_events(agent_client(node), revoked(2))["stored"] == 2
    state = AgentState.objects.get(node=node)
    assert state.events_in_minute == 2 and not node_online(state, timezone.now())


def test_admins_see_the_dropped_count_on_the_status_cards_and_prometheus_in_metrics(node, gpus, settings):
    settings.NODE_EVENTS_PER_MINUTE = 1
    settings.METRICS_TOKEN, settings.METRICS_ALLOWED_IPS = TOKEN, []
    client = agent_client(node)
    client.post(HEARTBEAT, heartbeat(), format="json")
    post_events(client, revoked(4))

    (card,) = fleet_status()
    assert card["agent"]["events_dropped"] == 3 and card["agent"]["events_dropped_at"] is not None
    (researchers_card,) = for_viewer(fleet_status(), admin=False)
    assert "agent" not in researchers_card
    scrape = Client(HTTP_AUTHORIZATION=f"Bearer {TOKEN}").get("/metrics").content.decode()
    assert metric_value(scrape, "gpubook_agent_events_dropped_total", node="gpu-a100") == 3


def test_events_older_than_the_keeping_time_are_pruned_in_batches(node, gpus, clock, settings, monkeypatch):
    settings.NODE_EVENTS_KEEP_DAYS = 90
    monkeypatch.setattr(ingest, "PRUNE_BATCH", 2)  # several batches from five events
    start = timezone.now()
    for days_ago, count in ((120, 3), (91, 2), (89, 4)):
        clock.move_to(start - timedelta(days=days_ago))
        agent_events_record(node=node, events=revoked(count, at=timezone.now()))
    clock.move_to(start)

    assert node_events_prune(timezone.now()) == 5
    assert node_events_prune(timezone.now()) == 0  # idempotent
    assert NodeEvent.objects.count() == 4
    settings.NODE_EVENTS_KEEP_DAYS = 0  # keep for good
    clock.shift(timedelta(days=365))
    assert node_events_prune(timezone.now()) == 0 and NodeEvent.objects.count() == 4


def test_beat_prunes_events_hourly():
    from nodes.tasks import prune_events
    from portal.celery import app

    entry = app.conf.beat_schedule["prune-node-events"]
    assert (entry["task"], entry["schedule"]) == (prune_events.name, 3600.0)


def test_threads_validating_at_once_with_the_shared_serializer_each_get_their_own_body_back():
    """nodes/agent_auth.py: one serializer per process validates every request's body, from the requests' own
    threads at the same time."""
    from concurrent.futures import ThreadPoolExecutor

    from rest_framework.exceptions import ValidationError

    from nodes.agent_auth import _validator
    from nodes.ingest_serializers import TelemetrySerializer

    def check(n: int) -> bool:
        body = {"sent_at": "2030-01-07T09:00:00Z", "gpus": [sample(f"GPU-{n}", utilization_pct=n % 101)] * 8}
        for _ in range(50):
            if n % 7 == 0:  # some refused, in between
                with pytest.raises(ValidationError) as refused:
                    _validator(TelemetrySerializer).run_validation({**body, "sent_at": "no"})
                if set(refused.value.detail) != {"sent_at"}:
                    return False
                continue
            gpus = _validator(TelemetrySerializer).run_validation(body)["gpus"]
            if [(g["uuid"], g["utilization_pct"]) for g in gpus] != [(f"GPU-{n}", n % 101)] * 8:
                return False
        return True

    with ThreadPoolExecutor(8) as pool:
        assert all(pool.map(check, range(40)))
