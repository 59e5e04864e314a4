from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from accounts.services import hash_token
from gpubook_agent.signing import verify
from nodes.models import Node
from reservations.leases import node_snapshot
from reservations.services import reservation_cancel, reservation_create
from tests.conftest import MONDAY_9, at

pytestmark = pytest.mark.usefixtures("clock")


def test_the_snapshot_holds_running_and_upcoming_approved_leases_within_a_day(alice, bob, carol, gpus, node, clock):
    running = reservation_create(user=alice, gpus=gpus[:2], start=at(0), end=at(2))
    soon = reservation_create(user=bob, gpus=gpus[2:3], start=at(5), end=at(6))
    reservation_create(user=bob, gpus=gpus[3:], start=at(30), end=at(31))  # beyond 24 h
    reservation_cancel(reservation=reservation_create(user=alice, gpus=gpus[3:], start=at(1), end=at(2)), actor=alice)
    node.requires_approval = True
    node.save()
    reservation_create(user=alice, gpus=gpus[3:], start=at(3), end=at(4))  # pending: holds the slot, opens nothing

    node.refresh_from_db()
    snapshot = node_snapshot(node=node, now=MONDAY_9)

    assert verify(snapshot, node.lease_secret)
    assert snapshot["node"] == "gpu-a100"
    assert snapshot["leases"] == [
        {
            "reservation": running.pk,
            "user": "alice",
            "gpus": [gpus[0].uuid, gpus[1].uuid],
            "start": "2030-01-07T09:00:00+00:00",
            "end": "2030-01-07T11:00:00+00:00",
        },
        {
            "reservation": soon.pk,
            "user": "bob",
            "gpus": [gpus[2].uuid],
            "start": "2030-01-07T14:00:00+00:00",
            "end": "2030-01-07T15:00:00+00:00",
        },
    ]


def test_every_snapshot_has_a_higher_version(node):
    versions = [node_snapshot(node=node, now=MONDAY_9)["version"] for _ in range(3)]
    assert versions == sorted(set(versions))
    assert versions[0] >= 1


def test_a_restored_database_still_sends_newer_versions_than_the_agent_holds(node):
    sent = node_snapshot(node=node, now=MONDAY_9)["version"]
    Node.objects.filter(pk=node.pk).update(lease_version=0)  # a backup from before any push

    assert node_snapshot(node=node, now=MONDAY_9 + timedelta(seconds=1))["version"] > sent


def test_a_lease_of_a_user_without_a_unix_username_is_left_out_not_the_whole_snapshot(alice, bob, gpus, node, clock):
    reservation_create(user=alice, gpus=gpus[:1], start=at(0), end=at(1))
    reservation_create(user=bob, gpus=gpus[1:2], start=at(0), end=at(1))
    type(bob).objects.filter(pk=bob.pk).update(unix_username=None)  # an admin cleared it afterwards

    leases = node_snapshot(node=node, now=at(0.5))["leases"]
    assert [lease["user"] for lease in leases] == ["alice"]


def test_a_finished_lease_leaves_the_snapshot(alice, gpus, node, clock):
    reservation_create(user=alice, gpus=gpus[:1], start=at(0), end=at(1))
    assert len(node_snapshot(node=node, now=at(0.5))["leases"]) == 1
    assert node_snapshot(node=node, now=at(1))["leases"] == []


def _register(*args: str) -> dict[str, str]:
    out = StringIO()
    call_command("register_node", *args, stdout=out)
    return dict(line.split("=", 1) for line in out.getvalue().splitlines() if "=" in line and not line.startswith("#"))


def test_registering_a_node_prints_its_agent_configuration_once(db):
    config = _register("gpu-h100", "--hostname", "h100.lab.example")

    node = Node.objects.get(name="gpu-h100")
    assert config["NODE_NAME"] == "gpu-h100"
    assert config["LEASE_SECRET"] == node.lease_secret
    assert node.agent_token_hash == hash_token(config["AGENT_TOKEN"])
    assert config["AGENT_TOKEN"] not in node.agent_token_hash
    assert {"BROKER_URL", "PORTAL_URL"} <= config.keys()
    with pytest.raises(CommandError, match="exists; use --rotate"):
        _register("gpu-h100")


def test_rotating_replaces_both_credentials(db):
    first = _register("gpu-h100")
    second = _register("gpu-h100", "--rotate")
    node = Node.objects.get(name="gpu-h100")
    assert second["LEASE_SECRET"] != first["LEASE_SECRET"]
    assert node.agent_token_hash == hash_token(second["AGENT_TOKEN"])


@pytest.mark.parametrize(("portal_url", "warned"), [("http://portal.lab", True), ("https://portal.lab", False)])
def test_registering_warns_when_the_agent_would_refuse_the_portals_url(db, settings, portal_url, warned):
    settings.PORTAL_URL = portal_url
    err = StringIO()
    call_command("register_node", "gpu-h100", stdout=StringIO(), stderr=err)
    assert ("ALLOW_INSECURE_PORTAL=true" in err.getvalue()) is warned


@pytest.mark.parametrize("name", ["Bad Name", "node;rm", "_x", "a" * 64])
def test_a_bad_node_name_is_refused(db, name):
    with pytest.raises(CommandError, match="name: Use 1 to 63"):
        _register(name)
    assert not Node.objects.exists()


def test_every_node_gets_its_own_secret(db):
    assert _register("a1")["LEASE_SECRET"] != _register("a2")["LEASE_SECRET"]


def test_admin_issues_new_agent_credentials_once_on_a_page(client, carol, node):
    client.force_login(carol)
    old_secret = node.lease_secret
    response = client.post("/admin/nodes/node/", {"action": "issue_agent_credentials", "_selected_action": [node.pk]})
    node.refresh_from_db()
    text = response.content.decode()
    assert "no-store" in response["Cache-Control"]
    assert node.lease_secret != old_secret
    assert f"LEASE_SECRET={node.lease_secret}" in text
    token = text.split("AGENT_TOKEN=")[1].split("\n")[0].strip()
    assert node.agent_token_hash == hash_token(token)
