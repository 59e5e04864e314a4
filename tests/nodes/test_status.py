"""The status cards (reservations/fleet.py, live/status.py): a GPU's state, who sees what, and what beat re-sends."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from live.status import refresh_status
from nodes.models import AgentState, GpuTelemetry, Node
from nodes.services import gpu_drain
from reservations.fleet import fleet_status, for_viewer
from reservations.models import MaintenanceWindow
from reservations.services import reservation_create
from tests.api_helpers import client_for
from tests.conftest import at

pytestmark = pytest.mark.usefixtures("clock")


def cards(node_name: str = "gpu-a100", **options) -> list[dict]:
    return next(n for n in fleet_status(**options) if n["name"] == node_name)["gpus"]


@pytest.fixture
def reporting(node):
    """The node's agent reported a moment ago, with a reading for GPU 0."""
    AgentState.objects.create(node=node, last_seen=timezone.now(), agent_version="0.1.0", backend="simulated")
    gpu = node.gpus.get(index=0)
    GpuTelemetry.objects.create(
        gpu=gpu,
        at=timezone.now(),
        utilization_pct=81,
        memory_used_mib=1024,
        memory_total_mib=81920,
        temperature_c=70,
        power_w=300.0,
        processes=[{"pid": 4242, "user": "alice", "used_memory_mib": 1000}],
    )
    return node


def test_a_gpu_state_says_what_matters_most(reporting, gpus, alice, carol):
    reservation_create(user=alice, gpus=[gpus[0]], start=at(1), end=at(3))
    assert [card["state"] for card in cards()] == ["free"] * 4

    with_holder = at(2)
    states = [card["state"] for card in cards(now=with_holder)]
    # At 11:00 the agent has been silent for two hours: offline outranks everything.
    assert states == ["offline"] * 4

    AgentState.objects.filter(node=reporting).update(last_seen=with_holder)
    gpu_drain(gpu=gpus[1], reason="processes of bob could not be ended (pids 7)")
    MaintenanceWindow.objects.create(node=reporting, gpu=gpus[2], start=at(0), end=at(4), reason="fan")
    gpus[3].bookable = False
    gpus[3].save()
    assert [card["state"] for card in cards(now=with_holder)] == ["in_use", "drained", "maintenance", "not_bookable"]

    first = cards(now=with_holder)[0]
    assert first["current"]["user"] == "alice"
    assert first["current"]["end"] == at(3).isoformat()
    assert first["telemetry"]["utilization_pct"] == 81

    Node.objects.filter(pk=reporting.pk).update(status=Node.Status.MAINTENANCE)
    assert {card["state"] for card in cards(now=with_holder)} >= {"maintenance", "drained"}


def test_researchers_get_the_cards_without_the_operational_details(reporting, gpus):
    gpu_drain(gpu=gpus[1], reason="processes of bob could not be ended (pids 7)")
    full = fleet_status()
    shown = for_viewer(full, admin=False)
    node = next(n for n in shown if n["name"] == "gpu-a100")
    assert "agent" not in node
    assert all("drain_reason" not in card for card in node["gpus"])
    assert node["gpus"][0]["telemetry"]["processes"] == [{"user": "alice", "used_memory_mib": 1000}]
    assert node["gpus"][1]["drained"] is True
    # The admin cut is the full one, untouched by the researchers' copy.
    admin_node = next(n for n in for_viewer(full, admin=True) if n["name"] == "gpu-a100")
    assert admin_node["gpus"][0]["telemetry"]["processes"][0]["pid"] == 4242
    assert admin_node["gpus"][1]["drain_reason"].startswith("processes of bob")


def test_the_status_api_and_page_need_a_login_and_show_each_their_cut(reporting, alice, carol):
    assert client_for(None).get("/api/v1/status/").status_code == 401
    assert Client().get("/status/").status_code == 302  # to the login page

    researcher = client_for(alice).get("/api/v1/status/").json()
    admin = client_for(carol).get("/api/v1/status/").json()
    assert "pid" not in researcher["nodes"][0]["gpus"][0]["telemetry"]["processes"][0]
    assert admin["nodes"][0]["gpus"][0]["telemetry"]["processes"][0]["pid"] == 4242

    page = Client()
    page.force_login(alice)
    response = page.get("/status/")
    assert response.status_code == 200
    html = response.content.decode()
    config = json.loads(html.split('<script id="status-config" type="application/json">')[1].split("</script>")[0])
    nodes = config["status"]["nodes"]
    shown = [gpu["telemetry"]["processes"] for node in nodes for gpu in node["gpus"] if gpu["telemetry"]]
    assert shown == [[{"user": "alice", "used_memory_mib": 1000}]]  # no pid
    assert b"Agent events" not in response.content


def test_beat_marks_a_silent_node_offline_once(reporting, django_capture_on_commit_callbacks):
    silent_until = timezone.now() + timedelta(seconds=41)
    with django_capture_on_commit_callbacks() as broadcasts:
        assert refresh_status(now=silent_until) == [reporting.pk]
    assert len(broadcasts) == 3  # the node's cards, its new "offline" alert (alerts/), and staff mail for it
    assert AgentState.objects.get(node=reporting).offline_since == silent_until
    with django_capture_on_commit_callbacks() as broadcasts:
        assert refresh_status(now=silent_until + timedelta(seconds=10)) == []
    assert broadcasts == []
    # Not yet silent long enough: not marked.
    AgentState.objects.filter(node=reporting).update(last_seen=timezone.now(), offline_since=None)
    assert refresh_status(now=timezone.now() + timedelta(seconds=39)) == []


def test_beat_resends_the_nodes_where_a_slot_began_or_ended(reporting, gpus, alice):
    other = Node.objects.create(name="gpu-quiet", hostname="quiet.lab")
    AgentState.objects.create(node=other, last_seen=at(2), agent_version="0.1.0", backend="simulated")
    reservation_create(user=alice, gpus=[gpus[0]], start=at(1), end=at(2))
    AgentState.objects.filter(node=reporting).update(last_seen=at(2))
    assert refresh_status(now=at(1) + timedelta(seconds=3)) == [reporting.pk]  # it began
    assert refresh_status(now=at(1, days=0) + timedelta(minutes=30)) == []  # nothing since
    AgentState.objects.filter(node=reporting).update(last_seen=at(3))
    assert refresh_status(now=at(2) + timedelta(seconds=1)) == [reporting.pk]  # it ended
