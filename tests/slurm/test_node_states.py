"""What Slurm says of its nodes shows where people look (issue 23): a drained or down node is in maintenance with
Slurm's state and reason on the calendar and the status page, and a Slurm node without our agent is not shown as
an agent gone silent. Read from recorded scontrol output (tests/slurm/test_scontrol.py)."""

from __future__ import annotations

import pytest
from django.core.checks import run_checks

from nodes.models import Node
from reservations.calendar_data import calendar_resources
from slurm.services import slurm_nodes_import
from tests.slurm.test_scontrol import NODE, RecordedScontrol

pytestmark = pytest.mark.django_db

DRAINED = "IDLE+DRAIN: fan failure [root@2026-12-06T06:50:52]"


@pytest.fixture
def drained() -> Node:
    slurm_nodes_import(controller=RecordedScontrol(NODE))
    return Node.objects.get(name="vm")


def test_a_drained_node_is_in_maintenance_with_slurms_words(drained):
    assert drained.status == Node.Status.MAINTENANCE and drained.manager_state == DRAINED
    assert drained.books_whole  # 22.05: whole nodes


def test_the_calendar_names_slurms_state_beside_the_node(drained):
    rows = {row["extendedProps"]["node"]: row for row in calendar_resources()}
    assert rows["vm"]["title"] == f"vm (in maintenance: {DRAINED}) (Slurm: booked whole)"
    assert rows["vm"]["extendedProps"]["bookable"] is False


def test_the_status_api_gives_slurms_state_and_does_not_call_the_node_offline(drained, client, alice):
    client.force_login(alice)
    node = next(row for row in client.get("/api/v1/status/").json()["nodes"] if row["name"] == "vm")
    assert (node["manager"], node["manager_state"], node["status"]) == ("slurm", DRAINED, "maintenance")
    assert node["online"] is True and node["last_seen"] is None
    assert {gpu["state"] for gpu in node["gpus"]} == {"maintenance"}


def test_a_node_back_in_service_is_active_again_with_its_new_state(drained):
    slurm_nodes_import(controller=RecordedScontrol(NODE.replace("State=IDLE+DRAIN", "State=IDLE").replace(
        " Reason=fan failure [root@2026-12-06T06:50:52]", ""
    )))  # fmt: skip
    drained.refresh_from_db()
    assert drained.status == Node.Status.ACTIVE and drained.manager_state == "IDLE"


def test_a_node_an_admin_disabled_stays_disabled_whatever_slurm_says(drained):
    Node.objects.filter(pk=drained.pk).update(status=Node.Status.DISABLED)
    slurm_nodes_import(controller=RecordedScontrol(NODE.replace("State=IDLE+DRAIN", "State=IDLE")))
    drained.refresh_from_db()
    assert drained.status == Node.Status.DISABLED and drained.manager_state.startswith("IDLE: ")


def test_a_node_slurm_says_is_down_is_offline_on_the_status_page(client, alice):
    down = NODE.replace("State=IDLE+DRAIN", "State=DOWN+NOT_RESPONDING").replace(
        "Reason=fan failure [root@2026-12-06T06:50:52]", "Reason=Not responding [slurm@2026-12-06T07:01:00]"
    )
    slurm_nodes_import(controller=RecordedScontrol(down))
    client.force_login(alice)
    node = next(row for row in client.get("/api/v1/status/").json()["nodes"] if row["name"] == "vm")
    assert node["online"] is False and node["manager_state"].startswith("DOWN+NOT_RESPONDING: Not responding")
    assert {gpu["state"] for gpu in node["gpus"]} == {"offline"}
    listed = next(row for row in client.get("/api/v1/nodes/").json()["results"] if row["name"] == "vm")
    assert (listed["manager"], listed["books_whole"], listed["status"]) == ("slurm", True, "maintenance")


def test_slurmrestd_without_credentials_is_a_warning_at_start(settings):
    settings.SLURM_RESTD_URL, settings.SLURM_RESTD_USER, settings.SLURM_RESTD_TOKEN = "http://ctl:6820", "", ""
    assert "slurm.W002" in {message.id for message in run_checks()}
    settings.SLURM_RESTD_USER, settings.SLURM_RESTD_TOKEN = "gpubook", "eyJ.e30.sig"
    assert "slurm.W002" not in {message.id for message in run_checks()}
