"""The portal's side of the idle power cap (docs/agent.md, "Power limits"): an admin sets it per node, validated;
it travels signed in the node's snapshot, which the agent's own check accepts; a change pushes the node at once;
the agent's power events and each card's power limit are stored from its reports, and nonsense is refused."""

from __future__ import annotations

import pytest
from django.db import IntegrityError, transaction
from django.utils import timezone

from audit.models import AuditEntry
from gpubook_agent import protocol
from gpubook_agent.signing import verify
from gpubook_agent.snapshot import decode_snapshot, parse_snapshot
from nodes.models import GpuTelemetry, Node, NodeEvent
from reservations import pushes
from reservations.leases import node_snapshot
from tests.conftest import MONDAY_9
from tests.nodes.queues import messages, purge
from tests.nodes.test_agent_reports import EVENTS, TELEMETRY, agent_client, sample
from tests.nodes.test_pushes import PORTAL_QUEUE, PUSH_TASK, agent_node  # noqa: F401 (the fixture)


def change_form(node: Node, **changes: object) -> dict[str, object]:
    """The node's admin change form as posted, its GPUs left as they are (no inline form sent)."""
    data: dict[str, object] = {
        "name": node.name,
        "hostname": node.hostname,
        "description": node.description,
        "status": node.status,
        "manager": node.manager,
        "idle_power_limit_pct": "" if node.idle_power_limit_pct is None else node.idle_power_limit_pct,
        "gpus-TOTAL_FORMS": 0,
        "gpus-INITIAL_FORMS": 0,
        "gpus-MIN_NUM_FORMS": 0,
        "gpus-MAX_NUM_FORMS": 1000,
        **changes,
    }
    if node.requires_approval:
        data["requires_approval"] = "on"
    return data


# -- the option and the snapshot ------------------------------------------------------------------------------


def test_the_cap_is_off_by_default_and_travels_signed_in_the_snapshot_the_agent_accepts(node):
    assert node.idle_power_limit_pct is None
    assert node_snapshot(node=node, now=MONDAY_9)["idle_power_limit_pct"] is None

    Node.objects.filter(pk=node.pk).update(idle_power_limit_pct=40)
    node.refresh_from_db()
    snapshot = node_snapshot(node=node, now=MONDAY_9)

    assert snapshot["idle_power_limit_pct"] == 40
    assert verify(snapshot, node.lease_secret)
    # What the agent does with a push: parse the JSON string, then check it whole.
    pushed = decode_snapshot(protocol.snapshot_message(snapshot))
    assert parse_snapshot(pushed, node_name=node.name, secret=node.lease_secret).idle_power_limit_pct == 40


@pytest.mark.parametrize("pct", [9, 101, 0])
def test_the_database_refuses_a_cap_outside_the_protocols_range(node, pct):
    with pytest.raises(IntegrityError), transaction.atomic():
        Node.objects.filter(pk=node.pk).update(idle_power_limit_pct=pct)


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ("5", "Ensure this value is greater than or equal to 10."),
        ("101", "Ensure this value is less than or equal to 100."),
        ("-40", "Ensure this value is greater than or equal to"),
        ("forty", "Enter a whole number."),
    ],
)
def test_the_admin_refuses_a_bad_cap_and_changes_nothing(client, carol, node, value, error):
    client.force_login(carol)

    response = client.post(f"/admin/nodes/node/{node.pk}/change/", change_form(node, idle_power_limit_pct=value))

    assert response.status_code == 200  # the form again, with the error
    assert error in response.content.decode()
    node.refresh_from_db()
    assert node.idle_power_limit_pct is None


def test_an_admin_who_sets_the_cap_is_audited_and_the_node_is_pushed_at_once(
    client,
    carol,
    agent_node,  # noqa: F811 (the fixture imported above)
    django_capture_on_commit_callbacks,
):
    client.force_login(carol)
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(
            f"/admin/nodes/node/{agent_node.pk}/change/", change_form(agent_node, idle_power_limit_pct="40")
        )

    assert response.status_code == 302, response.content.decode()[:2000]
    agent_node.refresh_from_db()
    assert agent_node.idle_power_limit_pct == 40
    assert [m["args"] for m in messages(PORTAL_QUEUE, task=PUSH_TASK)] == [[agent_node.pk]]
    entry = AuditEntry.objects.get(action="node.change")
    assert (entry.before["idle_power_limit_pct"], entry.after["idle_power_limit_pct"]) == (None, 40)
    changelist = client.get("/admin/nodes/node/").content.decode()
    assert "40 %" in changelist

    purge(PORTAL_QUEUE, pushes.PENDING_KEY.format(node_id=agent_node.pk))
    with django_capture_on_commit_callbacks(execute=True):
        client.post(f"/admin/nodes/node/{agent_node.pk}/change/", change_form(agent_node, idle_power_limit_pct=""))
    agent_node.refresh_from_db()
    assert agent_node.idle_power_limit_pct is None  # empty: off again
    assert len(messages(PORTAL_QUEUE, task=PUSH_TASK)) == 1


def test_saving_a_node_without_changing_the_cap_pushes_nothing(
    client,
    carol,
    agent_node,  # noqa: F811 (the fixture imported above)
    django_capture_on_commit_callbacks,
):
    client.force_login(carol)
    with django_capture_on_commit_callbacks(execute=True):
        client.post(f"/admin/nodes/node/{agent_node.pk}/change/", change_form(agent_node, description="racks 3-4"))

    assert messages(PORTAL_QUEUE, task=PUSH_TASK) == []


# -- what the agent reports -----------------------------------------------------------------------------------


def test_telemetry_keeps_each_cards_power_limit_and_an_older_agent_without_one_stores_none(client, carol, node, gpus):
    reporter = agent_client(node)
    capped = sample(gpus[0].uuid, power_w=60.0, power_limit_w=160.0)
    response = reporter.post(TELEMETRY, {"sent_at": timezone.now().isoformat(), "gpus": [capped]}, format="json")
    assert response.status_code == 200, response.json()
    reporter.post(TELEMETRY, {"sent_at": timezone.now().isoformat(), "gpus": [sample(gpus[1].uuid)]}, format="json")

    stored = dict(GpuTelemetry.objects.values_list("gpu_id", "power_limit_w"))
    assert stored == {gpus[0].pk: 160.0, gpus[1].pk: None}
    client.force_login(carol)
    assert "160 W" in client.get(f"/admin/nodes/node/{node.pk}/change/").content.decode()  # the GPUs' inline


@pytest.mark.parametrize("power_limit_w", [-1, -0.5, 100_001, "low", "nan", "inf"])
def test_a_power_limit_that_is_nonsense_is_refused(node, gpus, power_limit_w):
    body = {"sent_at": timezone.now().isoformat(), "gpus": [sample(gpus[0].uuid, power_limit_w=power_limit_w)]}

    response = agent_client(node).post(TELEMETRY, body, format="json")

    assert response.status_code == 400
    assert "gpus" in response.json()["error"]["details"]["fields"]
    assert not GpuTelemetry.objects.exists()


def test_the_agents_power_events_are_stored_with_the_limit_they_set(node, gpus):
    fields = {"gpu": gpus[0].uuid, "power_limit_w": 160.0, "message": "no lease holds the card: 400 W -> 160 W"}
    events = [
        protocol.event("power_capped", fields),
        protocol.event("power_restored", {**fields, "power_limit_w": 400.0, "message": "a lease holds the card"}),
        protocol.event("power_failed", {"message": "this node's ALLOW_POWER_CAP=false refuses it"}),
    ]

    response = agent_client(node).post(EVENTS, protocol.events(events), format="json")

    assert response.json() == {"stored": 3, "ignored_gpus": []}
    stored = NodeEvent.objects.order_by("id")
    assert [(event.kind, event.gpu_id, event.details) for event in stored] == [
        ("power_capped", gpus[0].pk, {"power_limit_w": 160.0}),
        ("power_restored", gpus[0].pk, {"power_limit_w": 400.0}),
        ("power_failed", None, {}),
    ]
    assert stored[0].get_kind_display() == "Power limit lowered (no booking)"


def test_a_power_event_with_a_negative_limit_is_refused(node, gpus):
    event = protocol.event("power_capped", {"gpu": gpus[0].uuid, "power_limit_w": -160.0})

    response = agent_client(node).post(EVENTS, protocol.events([event]), format="json")

    assert response.status_code == 400
    assert not NodeEvent.objects.exists()
