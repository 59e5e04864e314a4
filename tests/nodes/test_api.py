from __future__ import annotations

import re
from datetime import timedelta

import pytest

from reservations.models import Limit
from reservations.services import reservation_create
from tests.api_helpers import client_for
from tests.conftest import at
from tests.factories import node_with_gpus

pytestmark = pytest.mark.usefixtures("clock")


def test_gpus_show_their_current_holder_and_next_booking(alice, bob, gpus, clock):
    running = reservation_create(user=alice, gpus=gpus[:1], start=at(0), end=at(2))
    upcoming = reservation_create(user=bob, gpus=gpus[:1], start=at(3), end=at(5))

    body = client_for(bob).get("/api/v1/gpus/?node=gpu-a100").json()
    gpu0 = body["results"][0]

    assert gpu0["current"] == {
        "reservation": running.pk,
        "user": "alice",
        "start": "2030-01-07T09:00:00Z",
        "end": "2030-01-07T11:00:00Z",
    }
    assert gpu0["next"]["reservation"] == upcoming.pk
    assert body["results"][1]["current"] is None and body["results"][1]["next"] is None


def test_gpu_filters(alice, gpus):
    node_with_gpus(2, name="gpu-4090")
    from nodes.models import Gpu

    Gpu.objects.filter(node__name="gpu-4090").update(model="NVIDIA GeForce RTX 4090", memory_mib=24564)
    client = client_for(alice)
    assert client.get("/api/v1/gpus/?model=4090").json()["count"] == 2
    assert client.get("/api/v1/gpus/?min_memory_gb=24").json()["count"] == 6
    assert client.get("/api/v1/gpus/?min_memory_gb=40").json()["count"] == 4
    bad = client.get("/api/v1/gpus/?min_memory_gb=lots")
    assert bad.status_code == 400
    assert "min_memory_gb" in bad.json()["error"]["details"]["fields"]


def test_nodes_list_counts_gpus(alice, node):
    body = client_for(alice).get("/api/v1/nodes/").json()
    assert [(n["name"], n["gpu_count"]) for n in body["results"]] == [("gpu-a100", 4)]
    assert client_for(alice).get("/api/v1/nodes/nope/").status_code == 404


def test_me_shows_limits_and_use(alice, gpus, clock):
    Limit.objects.create(scope="site", max_gpus_at_once=4, weekly_gpu_hours=40)
    reservation_create(user=alice, gpus=gpus[:2], start=at(0), end=at(3))
    body = client_for(alice).get("/api/v1/me/").json()
    assert body["unix_username"] == "alice"
    assert body["gpus_at_once"] == {"allowed": 4.0, "used": 2}
    assert body["weekly_gpu_hours"] == {"allowed": 40.0, "used": 6.0}
    assert body["max_slot_hours"] == 168.0  # no Limit sets it: the site ceiling MAX_SLOT_HOURS
    assert body["max_days_ahead"] == 90  # likewise MAX_DAYS_AHEAD
    clock.shift(timedelta(hours=4))
    assert client_for(alice).get("/api/v1/me/").json()["gpus_at_once"]["used"] == 0


def test_the_schema_and_docs_are_served(client, alice):
    schema = client.get("/api/schema/")
    assert schema.status_code == 200
    text = schema.content.decode()
    for path in ["/api/v1/reservations/{id}/extend/", "/api/v1/gpus/", "/api/v1/me/", "/api/v1/agent/snapshot/"]:
        assert path in text
    assert "'409':" in text
    docs = client.get("/api/docs/")
    assert docs.status_code == 200
    # Swagger UI comes from our own static files (the sidecar), never from a CDN: every
    # script, stylesheet and icon is on this site.
    page = docs.content.decode()
    addresses = re.findall(r"""(?:src|href)=["']([^"']+)""", page)
    assert any(address.endswith("swagger-ui-bundle.js") for address in addresses)
    assert all(address.startswith("/") and not address.startswith("//") for address in addresses), addresses
