"""Live updates over real websockets: a real daphne serving portal.asgi, the Redis channel layer,
and the websockets library as the client (a browser page's cookie, or a script's token)."""

from __future__ import annotations

from datetime import timedelta

import pytest
import requests
from celery.contrib.testing.worker import start_worker
from django.conf import settings
from django.db import transaction
from django.utils import timezone
from websockets.exceptions import ConnectionClosed, InvalidStatus

from accounts.services import api_token_revoke
from alerts.models import Alert
from alerts.records import Subject, alert_open, alerts_resolve
from live.status import refresh_status
from live.tasks import refresh_live_status
from nodes.models import AgentState, Node
from portal.celery import app
from reservations.models import Allocation, MaintenanceWindow, Reservation
from reservations.services import reservation_create
from tests.live.server import AsgiServer, heartbeat, open_client, post_agent, session_for, telemetry

pytestmark = pytest.mark.postgres_only


def closed_with(client) -> int:
    with pytest.raises(ConnectionClosed) as closed:
        for _ in range(5):
            client.next(timeout=5)
    return closed.value.rcvd.code


def first_of_each(client, *types: str) -> list[dict]:
    """The first message of each type, in the order of ``types``, whatever order they came in."""
    found: dict[str, dict] = {}
    client.wait_for(lambda m: found.setdefault(m["type"], m) is not None and set(types) <= found.keys())
    return [found[t] for t in types]


def gpu_card(message: dict, node: str, index: int) -> dict:
    cards = next(n for n in message["nodes"] if n["name"] == node)["gpus"]
    return next(card for card in cards if card["index"] == index)


# --- who may connect --------------------------------------------------------------------------


def test_a_page_without_a_login_is_told_to_log_in_and_closed(asgi_server, live_lab):
    client = open_client(asgi_server, origin=asgi_server.url)
    error = client.next()
    assert (error["type"], error["code"]) == ("error", "not_authenticated")
    assert "Log in" in error["message"]
    assert closed_with(client) == 4401


def test_a_logged_in_page_of_the_portal_gets_the_status_snapshot(asgi_server, live_lab):
    client = open_client(asgi_server, session=session_for(live_lab["researcher"]), origin=asgi_server.url)
    messages = client.subscribe("status")
    snapshot, subscribed = messages[0], messages[-1]
    assert subscribed == {"type": "subscribed", "topics": ["status"]}
    assert snapshot["type"] == "nodes" and snapshot["full"] is True
    assert [gpu["index"] for gpu in next(n for n in snapshot["nodes"] if n["name"] == "live-a100")["gpus"]] == [0, 1]
    client.close()


def test_another_sites_page_is_refused_even_with_a_valid_session(asgi_server, live_lab):
    # Cross-site websocket hijacking: the browser would send our cookie from evil.example.
    with pytest.raises(InvalidStatus) as refused:
        open_client(asgi_server, session=session_for(live_lab["admin"]), origin="http://evil.example")
    assert refused.value.response.status_code == 403
    # The same host on another port is another origin too.
    with pytest.raises(InvalidStatus):
        open_client(asgi_server, session=session_for(live_lab["admin"]), origin="http://127.0.0.1:1")


def test_a_session_cookie_without_an_origin_is_not_enough(asgi_server, live_lab):
    client = open_client(asgi_server, session=session_for(live_lab["researcher"]))
    error = client.next()
    assert error["code"] == "not_authenticated" and "Bearer" in error["message"]
    assert closed_with(client) == 4401


def test_a_script_connects_with_its_api_token_and_no_origin(asgi_server, live_lab):
    client = open_client(asgi_server, token=live_lab["researcher_token"])
    assert client.subscribe("status", "calendar")[-1]["topics"] == ["calendar", "status"]
    client.close()


@pytest.mark.parametrize("token", ["gpb_not-a-real-token", "agent"])
def test_a_bad_or_node_token_is_refused_with_the_reason(asgi_server, live_lab, token):
    client = open_client(asgi_server, token=live_lab["agent_token"] if token == "agent" else token)
    error = client.next()
    assert error["code"] == "not_authenticated"
    assert error["message"] == "Unknown or revoked API token."
    assert closed_with(client) == 4401


def test_a_revoked_token_loses_its_open_connection(asgi_server, live_lab):
    client = open_client(asgi_server, token=live_lab["researcher_token"])
    client.subscribe("calendar")
    token = live_lab["researcher"].api_tokens.get()
    api_token_revoke(token=token, actor=live_lab["researcher"])
    # The server re-checks every LIVE_RECHECK_SECONDS (1 s here).
    error = client.wait_for(lambda m: m["type"] == "error", timeout=10)
    assert "no longer valid" in error["message"]
    assert closed_with(client) == 4401


# --- who may subscribe to what, and what each sees --------------------------------------------


def test_only_admins_may_follow_the_agents_events(asgi_server, live_lab):
    researcher = open_client(asgi_server, token=live_lab["researcher_token"])
    messages = researcher.subscribe("events", "calendar", "gossip")
    errors = [m for m in messages if m["type"] == "error"]
    assert [e["code"] for e in errors] == ["forbidden", "unknown_topic"]
    assert messages[-1]["topics"] == ["calendar"]

    admin = open_client(asgi_server, token=live_lab["admin_token"])
    assert admin.subscribe("events")[-1]["topics"] == ["events"]
    post_agent(
        asgi_server,
        live_lab,
        "events",
        {"events": [{"kind": "violation", "at": timezone.now().isoformat(), "gpu": "GPU-live-1", "user": "mallory"}]},
    ).raise_for_status()
    events = admin.wait_for(lambda m: m["type"] == "events")
    assert events["node"] == "live-a100"
    assert [(e["kind"], e["gpu"], e["user"]) for e in events["events"]] == [("violation", 1, "mallory")]
    # The researcher, subscribed to the calendar only, got nothing of it.
    with pytest.raises(TimeoutError):
        researcher.next(timeout=1)
    researcher.close()
    admin.close()


def test_alerts_reach_the_admins_once_committed_and_a_rolled_back_one_never(asgi_server, live_lab):
    admin = open_client(asgi_server, token=live_lab["admin_token"])
    admin.subscribe("alerts")
    hot = Subject(Alert.Kind.TEMPERATURE, live_lab["node"].pk, live_lab["gpus"][0].pk)
    with transaction.atomic():
        alert_open(subject=hot, now=timezone.now(), details={})
        transaction.set_rollback(True)
    with pytest.raises(TimeoutError):
        admin.next(timeout=1)

    with transaction.atomic():
        alert = alert_open(subject=hot, now=timezone.now(), details={})
        with pytest.raises(TimeoutError):  # not before the commit
            admin.next(timeout=1)
    opened = admin.wait_for(lambda m: m["type"] == "alerts")
    assert [(a["id"], a["kind"], a["node"], a["gpu"], a["open"]) for a in opened["alerts"]] == [
        (alert.pk, "temperature", "live-a100", 0, True)
    ]

    alerts_resolve(hot.open_alerts(), now=timezone.now(), resolution="cooled down")
    resolved = admin.wait_for(lambda m: m["type"] == "alerts")
    assert [(a["id"], a["open"], a["resolution"]) for a in resolved["alerts"]] == [(alert.pk, False, "cooled down")]
    admin.close()


def test_telemetry_reaches_every_status_page_as_the_api_would_show_it(asgi_server, live_lab):
    researcher = open_client(asgi_server, token=live_lab["researcher_token"])
    admin = open_client(asgi_server, session=session_for(live_lab["admin"]), origin=asgi_server.url)
    researcher.subscribe("status")
    admin.subscribe("status")
    gpu_id = str(live_lab["gpus"][0].pk)

    # The node comes online: its whole cards, with the agent's details for admins only.
    post_agent(asgi_server, live_lab, "heartbeat", heartbeat()).raise_for_status()
    online = lambda m: m["type"] == "nodes" and m["nodes"][0]["online"]  # noqa: E731
    assert "agent" not in researcher.wait_for(online)["nodes"][0]
    assert admin.wait_for(online)["nodes"][0]["agent"]["backend"] == "simulated"

    # Then each report: the new readings alone.
    post_agent(asgi_server, live_lab, "telemetry", telemetry(utilization=93)).raise_for_status()
    seen_by_researcher = researcher.wait_for(lambda m: m["type"] == "telemetry")["nodes"]["live-a100"]
    seen_by_admin = admin.wait_for(lambda m: m["type"] == "telemetry")["nodes"]["live-a100"]
    assert list(seen_by_researcher["gpus"]) == [gpu_id]
    reading = seen_by_researcher["gpus"][gpu_id]
    assert (reading["utilization_pct"], reading["temperature_c"], reading["power_w"]) == (93, 64, 231.0)
    assert reading["processes"] == [{"user": "rita", "used_memory_mib": 4000}]
    assert seen_by_admin["gpus"][gpu_id]["processes"] == [{"pid": 4242, "user": "rita", "used_memory_mib": 4000}]

    # The REST API shows each of them the same cut.
    for who, seen in (("researcher", seen_by_researcher), ("admin", seen_by_admin)):
        answer = requests.get(
            f"{asgi_server.url}/api/v1/status/",
            headers={"Authorization": f"Bearer {live_lab[f'{who}_token']}"},
            timeout=10,
        )
        card = gpu_card(answer.json(), "live-a100", 0)
        assert card["telemetry"]["processes"] == seen["gpus"][gpu_id]["processes"]
        assert ("drain_reason" in card) == (who == "admin")
        assert [point[1] for point in card["history"]] == [93]  # the sparkline's first point
    researcher.close()
    admin.close()


def test_a_slot_that_begins_changes_the_holder_on_every_page(asgi_server, live_lab):
    watcher = open_client(asgi_server, token=live_lab["researcher_token"])
    watcher.subscribe("status")
    now = timezone.now()
    booking = Reservation.objects.create(
        user=live_lab["researcher"],
        node=live_lab["node"],
        start=now - timedelta(seconds=1),  # it began a moment ago: no booking change announced it
        end=now + timedelta(hours=1),
        status=Reservation.Status.APPROVED,
        created_by=live_lab["researcher"],
    )
    Allocation.objects.create(reservation=booking, gpu=live_lab["gpus"][1], start=booking.start, end=booking.end)
    assert refresh_status() == [live_lab["node"].pk]  # beat, every STATUS_REFRESH_SECONDS
    card = gpu_card(watcher.wait_for(lambda m: m["type"] == "nodes"), "live-a100", 1)
    assert card["current"]["user"] == "rita"
    watcher.close()


def test_a_booking_tells_calendars_where_and_when_and_updates_the_holder(asgi_server, live_lab):
    watcher = open_client(asgi_server, token=live_lab["admin_token"])
    watcher.subscribe("calendar", "status")
    start = (timezone.now() + timedelta(days=1)).replace(minute=0, second=0, microsecond=0)
    reservation_create(
        user=live_lab["researcher"],
        gpus=[live_lab["gpus"][1]],
        start=start,
        end=start + timedelta(hours=2),
        purpose="secret thesis experiment",
        actor=live_lab["researcher"],
    )
    change, nodes = first_of_each(watcher, "calendar", "nodes")
    assert change["node"] == "live-a100"
    assert (change["start"], change["end"]) == (start.isoformat(), (start + timedelta(hours=2)).isoformat())
    # Only where and when: the calendar API decides what each user sees of it.
    assert "secret" not in str(change) and "rita" not in str(change)
    assert gpu_card(nodes, "live-a100", 1)["next"]["user"] == "rita"
    watcher.close()


def test_a_maintenance_window_edited_by_an_admin_is_announced(asgi_server, live_lab):
    watcher = open_client(asgi_server, token=live_lab["researcher_token"])
    watcher.subscribe("calendar", "status")
    now = timezone.now()
    MaintenanceWindow.objects.create(node=live_lab["node"], start=now, end=now + timedelta(hours=1), reason="new PSU")
    change, nodes = first_of_each(watcher, "calendar", "nodes")
    assert change["node"] == "live-a100"
    assert gpu_card(nodes, "live-a100", 0)["maintenance"]["reason"] == "new PSU"
    watcher.close()


# --- offline and back -------------------------------------------------------------------------


def test_a_silent_node_turns_offline_and_back_online_when_it_reports(asgi_server, live_lab):
    watcher = open_client(asgi_server, token=live_lab["researcher_token"])
    post_agent(asgi_server, live_lab, "heartbeat", heartbeat()).raise_for_status()
    snapshot = watcher.subscribe("status")[0]
    assert next(n for n in snapshot["nodes"] if n["name"] == "live-a100")["online"] is True

    silent_since = timezone.now() - timedelta(seconds=settings.AGENT_OFFLINE_AFTER_SECONDS + 5)
    AgentState.objects.filter(node=live_lab["node"]).update(last_seen=silent_since)
    with start_worker(app, pool="solo", perform_ping_check=False, shutdown_timeout=10):
        refresh_live_status.delay()  # what beat sends every STATUS_REFRESH_SECONDS
        offline = watcher.wait_for(lambda m: m["type"] == "nodes", timeout=15)
    node = next(n for n in offline["nodes"] if n["name"] == "live-a100")
    assert node["online"] is False
    assert {gpu["state"] for gpu in node["gpus"]} == {"offline"}
    assert AgentState.objects.get(node=live_lab["node"]).offline_since is not None

    post_agent(asgi_server, live_lab, "heartbeat", heartbeat()).raise_for_status()
    back = watcher.wait_for(lambda m: m["type"] == "nodes")
    assert next(n for n in back["nodes"] if n["name"] == "live-a100")["online"] is True
    watcher.close()


def test_a_node_deleted_in_admin_disappears_from_every_page(asgi_server, live_lab):
    watcher = open_client(asgi_server, token=live_lab["researcher_token"])
    watcher.subscribe("status")
    Node.objects.filter(pk=live_lab["node"].pk).delete()
    full = watcher.wait_for(lambda m: m["type"] == "nodes" and m["full"])
    assert "live-a100" not in [n["name"] for n in full["nodes"]]
    watcher.close()


def test_a_portal_on_another_redis_database_hears_nothing_of_ours(asgi_server, live_lab):
    # Redis pub/sub ignores database numbers: without the prefix a second portal (or the tests)
    # on the same Redis would show our nodes on its status page.
    redis_url = settings.REDIS_URL.rsplit("/", 1)[0] + "/14"
    neighbour = AsgiServer(REDIS_URL=redis_url)
    neighbour.start()
    try:
        theirs = open_client(neighbour, token=live_lab["researcher_token"])
        theirs.subscribe("calendar")
        ours = open_client(asgi_server, token=live_lab["researcher_token"])
        ours.subscribe("calendar")
        MaintenanceWindow.objects.create(
            node=live_lab["node"], start=timezone.now(), end=timezone.now() + timedelta(hours=1)
        )
        assert ours.wait_for(lambda m: m["type"] == "calendar")["node"] == "live-a100"
        with pytest.raises(TimeoutError):
            theirs.next(timeout=1)
    finally:
        neighbour.stop()


# --- bad input and restarts -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ("not json", "Not JSON"),
        ('["subscribe"]', 'Send {"subscribe"'),
        ('{"subscribe": "status"}', "takes a list"),
        ("x" * 5000, "at most 4096"),
    ],
)
def test_malformed_messages_get_an_explanation_and_keep_the_connection(asgi_server, live_lab, message, expected):
    client = open_client(asgi_server, token=live_lab["researcher_token"])
    client.send(message)
    error = client.next()
    assert error["type"] == "error" and expected in error["message"]
    assert client.subscribe("calendar")[-1]["topics"] == ["calendar"]
    client.close()


def test_after_a_server_restart_a_client_reconnects_and_gets_updates_again(asgi_server, live_lab):
    client = open_client(asgi_server, token=live_lab["researcher_token"])
    client.subscribe("status")
    asgi_server.stop()
    with pytest.raises(ConnectionClosed):
        client.next(timeout=10)
    asgi_server.start()
    client = open_client(asgi_server, token=live_lab["researcher_token"])
    assert client.subscribe("status")[0]["full"] is True
    post_agent(asgi_server, live_lab, "heartbeat", heartbeat()).raise_for_status()
    post_agent(asgi_server, live_lab, "telemetry", telemetry(utilization=12)).raise_for_status()
    client.wait_for(lambda m: m["type"] == "nodes" and not m["full"])
    client.close()
