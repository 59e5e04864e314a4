from __future__ import annotations

import pytest

from nodes.models import Node
from reservations.models import MaintenanceWindow
from reservations.services import reservation_create
from tests.api_helpers import client_for
from tests.conftest import at
from tests.factories import node_with_gpus

pytestmark = pytest.mark.usefixtures("clock")


def windows(user, query: str):
    response = client_for(user).get(f"/api/v1/availability/?{query}")
    assert response.status_code == 200, response.json()
    return [(w["node"], w["gpu_indexes"], w["start"], w["end"]) for w in response.json()["results"]]


def test_an_empty_node_is_free_now(alice, node):
    assert windows(alice, "gpus=2&hours=3") == [("gpu-a100", [0, 1], "2030-01-07T09:00:00Z", "2030-01-07T12:00:00Z")]


def test_the_window_opens_when_enough_gpus_come_free(alice, bob, gpus):
    reservation_create(user=bob, gpus=gpus[:3], start=at(0), end=at(2))
    reservation_create(user=bob, gpus=gpus[3:], start=at(0), end=at(5))
    # 2 GPUs for 2 hours: GPUs 0-2 are free from 11:00.
    assert windows(alice, "gpus=2&hours=2") == [("gpu-a100", [0, 1], "2030-01-07T11:00:00Z", "2030-01-07T13:00:00Z")]
    # All 4: only when GPU 3 is free too.
    assert windows(alice, "gpus=4&hours=1")[0][2] == "2030-01-07T14:00:00Z"


def test_a_gap_too_short_is_skipped(alice, bob, gpus):
    reservation_create(user=bob, gpus=gpus, start=at(0), end=at(1))
    reservation_create(user=bob, gpus=gpus, start=at(2), end=at(4))
    assert windows(alice, "gpus=1&hours=2")[0][2:] == ("2030-01-07T13:00:00Z", "2030-01-07T15:00:00Z")
    assert windows(alice, "gpus=1&hours=1")[0][2:] == ("2030-01-07T10:00:00Z", "2030-01-07T11:00:00Z")


def test_maintenance_and_inactive_nodes_are_avoided(alice, node):
    MaintenanceWindow.objects.create(node=node, start=at(0), end=at(3))
    other = node_with_gpus(2, name="gpu-4090", status=Node.Status.DISABLED)
    assert windows(alice, "gpus=1&hours=1") == [("gpu-a100", [0], "2030-01-07T12:00:00Z", "2030-01-07T13:00:00Z")]
    other.status = Node.Status.ACTIVE
    other.save()
    assert [w[0] for w in windows(alice, "gpus=1&hours=1")] == ["gpu-4090", "gpu-a100"]
    assert windows(alice, "gpus=3&hours=1&node=gpu-4090") == []


def test_after_moves_the_search(alice, node):
    assert windows(alice, "gpus=1&hours=1&after=2030-01-08T10:07:00%2B00:00")[0][2] == "2030-01-08T10:00:00Z"


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("hours=1", "gpus"),
        ("gpus=0&hours=1", "gpus"),
        ("gpus=1&hours=x", "hours"),
        ("gpus=1&hours=1&after=soon", "after"),
        ("gpus=1&hours=1&after=2030-01-08T10:00:00", "after"),
    ],
)
def test_bad_queries_are_400(alice, node, query, field):
    response = client_for(alice).get(f"/api/v1/availability/?{query}")
    assert response.status_code == 400
    assert field in response.json()["error"]["details"]["fields"]


def test_a_found_window_can_be_booked(alice, bob, gpus):
    reservation_create(user=bob, gpus=gpus[:3], start=at(0), end=at(2))
    (node, _indexes, start, end), *_ = windows(alice, "gpus=2&hours=1.5")
    response = client_for(alice).post(
        "/api/v1/reservations/", {"node": node, "gpu_count": 2, "start": start, "end": end}, format="json"
    )
    assert response.status_code == 201, response.json()


def test_a_window_weeks_away_is_found(alice, bob, carol, gpus):
    reservation_create(user=bob, gpus=gpus, start=at(0), end=at(10 * 24), actor=carol)
    assert windows(alice, "gpus=4&hours=2") == [
        ("gpu-a100", [0, 1, 2, 3], "2030-01-17T09:00:00Z", "2030-01-17T11:00:00Z")
    ]
