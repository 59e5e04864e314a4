"""Where admins see alerts: Django admin (filters, "resolve") and the status page's panel; the
websocket topic "alerts" over a real daphne, refused to researchers."""

from __future__ import annotations

import json

import pytest
from django.utils import timezone

from alerts.models import Alert
from nodes.models import NodeEvent
from tests.alerts.helpers import event, report
from tests.live.server import open_client, post_agent, session_for


def hot(node, gpu):
    report(node, gpu, temperature_c=92)
    report(node, gpu, temperature_c=93)


def test_admin_lists_alerts_with_filters_by_kind_state_and_node(client, carol, node, gpus):
    hot(node, gpus[0])
    event(node, NodeEvent.Kind.VIOLATION, gpus[1], "mallory")
    report(node, gpus[0], temperature_c=50)  # the temperature alert resolves
    client.force_login(carol)

    page = client.get("/admin/alerts/alert/?open=yes").content.decode()
    assert "mallory" in page and "Use without a booking" in page
    assert "93 °C" not in page
    page = client.get("/admin/alerts/alert/?open=no&kind=temperature").content.decode()
    assert "93 °C (alert at 85 °C, slowdown at 95 °C)" in page
    assert client.get(f"/admin/alerts/alert/?node__id__exact={node.pk}").status_code == 200


def test_the_resolve_action_returns_a_drained_gpu_to_service(client, carol, node, gpus):
    event(node, NodeEvent.Kind.UNKILLABLE, gpus[2], "bob", pids=[66])
    alert = Alert.objects.get(kind="unkillable")
    client.force_login(carol)
    response = client.post("/admin/alerts/alert/", {"action": "resolve", "_selected_action": [alert.pk]}, follow=True)
    assert "1 alert(s) resolved." in response.content.decode()
    alert.refresh_from_db()
    gpus[2].refresh_from_db()
    assert gpus[2].drained_at is None
    assert alert.resolved_at is not None and alert.resolved_by == carol


def test_researchers_cannot_see_alerts_in_admin(client, alice, node, gpus):
    hot(node, gpus[0])
    client.force_login(alice)
    assert client.get("/admin/alerts/alert/").status_code == 302  # to the admin login


def test_the_status_page_shows_open_alerts_to_admins_only(client, carol, alice, node, gpus):
    hot(node, gpus[3])
    client.force_login(carol)
    page = client.get("/status/").content.decode()
    assert "Open alerts" in page
    start = page.index('<script id="alerts-data" type="application/json">') + len(
        '<script id="alerts-data" type="application/json">'
    )
    (shown,) = json.loads(page[start : page.index("</script>", start)])
    assert (shown["kind"], shown["node"], shown["gpu"], shown["open"]) == ("temperature", "gpu-a100", 3, True)

    client.force_login(alice)
    page = client.get("/status/").content.decode()
    assert "Open alerts" not in page and "alerts-data" not in page


@pytest.mark.postgres_only
def test_the_alerts_topic_is_for_admins_and_follows_alerts_live(asgi_server, live_lab):
    researcher = open_client(asgi_server, session=session_for(live_lab["researcher"]), origin=asgi_server.url)
    refused = researcher.subscribe("alerts")
    assert refused[0] == {"type": "error", "code": "forbidden", "message": "Only booking admins may follow alerts."}
    assert refused[-1]["topics"] == []
    researcher.close()

    admin = open_client(asgi_server, token=live_lab["admin_token"])
    snapshot, subscribed = admin.subscribe("alerts")
    assert snapshot == {"type": "alerts", "full": True, "alerts": []}
    assert subscribed["topics"] == ["alerts"]

    violation = {"kind": "violation", "at": timezone.now().isoformat(), "gpu": "GPU-live-1", "user": "mallory"}
    post_agent(asgi_server, live_lab, "events", {"events": [violation]}).raise_for_status()
    opened = admin.wait_for(lambda m: m["type"] == "alerts")
    (alert,) = opened["alerts"]
    assert (alert["kind"], alert["gpu"], alert["user"], alert["open"]) == ("violation", 1, "mallory", True)
    admin.close()
