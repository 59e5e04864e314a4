"""Launching environments in bookings, the portal's side (issue 22): only a booking's holder launches in it, and
only while the booking lives; the launch travels signed in the node's snapshot, in the booking's lease, until it is
stopped or over; the node's heartbeats bring its state, output and connection, for its own bookings only; the
notebook's token is shown to the holder alone. Refusals come with words and change nothing."""

from __future__ import annotations

import pytest
from django.test import Client
from django.utils import timezone

from environments.models import Environment, Launch
from environments.services import MAX_LAUNCHES_PER_BOOKING, launches_close_overdue
from gpubook_agent import protocol
from gpubook_agent.snapshot import parse_snapshot
from nodes.models import Node
from nodes.services import node_rotate_credentials
from reservations.leases import node_snapshot
from reservations.services import reservation_cancel, reservation_create
from tests.api_helpers import client_for
from tests.conftest import MONDAY_9, at
from tests.factories import node_with_gpus

pytestmark = pytest.mark.usefixtures("clock")

LAUNCHES = "/api/v1/launches/"
NOTEBOOK = ["jupyter", "lab", "--no-browser", "--ip=127.0.0.1", "--port={port}", "--IdentityProvider.token={token}"]


@pytest.fixture
def notebook(db) -> Environment:
    return Environment.objects.create(
        name="Jupyter, PyTorch 2.5", image="registry.example.org/lab/jupyter:2.5", command=NOTEBOOK, memory_max_gb=16
    )


@pytest.fixture
def running(alice, gpus):
    return reservation_create(user=alice, gpus=gpus[:2], start=at(0), end=at(2))


def lease_of(node: Node, reservation_id: int) -> protocol.Lease:
    node.refresh_from_db()
    [lease] = [
        lease
        for lease in node_snapshot(node=node, now=timezone.now())["leases"]
        if lease["reservation"] == reservation_id
    ]
    return lease


def launch(user, reservation, environment):
    return client_for(user).post(
        LAUNCHES, {"reservation": reservation.pk, "environment": environment.pk}, format="json"
    )


def heartbeat(node: Node, launches: list[dict]) -> int:
    """Post a heartbeat as ``node``'s agent does, with its token."""
    client = Client(HTTP_AUTHORIZATION=f"Bearer {node_rotate_credentials(node=node).agent_token}")
    body = protocol.heartbeat(
        backend="simulated", driver_version=None, applied_version=0, acls={}, launches=launches, sent_at=timezone.now()
    )
    return client.post("/api/v1/agent/heartbeat/", body, content_type="application/json").status_code


def status(reservation, number=1, state="running", **fields) -> dict:
    return {"reservation": reservation.pk, "number": number, "state": state, "exit_code": None, "message": "",
            "port": None, "token": "", "tail": "", **fields}  # fmt: skip


def test_the_holder_launches_in_a_running_booking_and_the_node_gets_it_signed_in_the_lease(
    alice, node, running, notebook
):
    response = launch(alice, running, notebook)

    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["state"], body["number"], body["environment_name"], body["node"]) == (
        "requested",
        1,
        "Jupyter, PyTorch 2.5",
        "gpu-a100",
    )
    lease = lease_of(node, running.pk)
    assert lease["launches"] == [
        {
            "number": 1,
            "kind": "container",
            "image": "registry.example.org/lab/jupyter:2.5",
            "argv": NOTEBOOK,
            "memory_max_bytes": 16 * 1024**3,
            "max_processes": None,
        }
    ]
    # The agent's own parser takes it as a launch to run (no problem found).
    node.refresh_from_db()
    parsed = parse_snapshot(node_snapshot(node=node, now=timezone.now()), node_name=node.name, secret=node.lease_secret)
    [order] = next(lease for lease in parsed.leases if lease.reservation == running.pk).launches
    assert order.problem is None and order.image == notebook.image
    # A second launch gets the next number.
    assert launch(alice, running, notebook).json()["number"] == 2


def test_a_launch_asked_for_at_booking_time_waits_in_the_upcoming_lease(alice, node, gpus, notebook):
    later = reservation_create(user=alice, gpus=gpus[2:3], start=at(3), end=at(4))
    assert launch(alice, later, notebook).status_code == 201
    lease = lease_of(node, later.pk)
    assert lease["start"] == at(3).isoformat()
    assert [item["number"] for item in lease["launches"]] == [1]


@pytest.mark.parametrize(
    ("who", "code", "words"),
    [
        ("bob", 400, "No booking #"),  # someone else's booking does not exist for them
        ("carol", 403, "Only the booking's holder can launch"),  # an admin sees it, and may not run things as alice
    ],
)
def test_only_the_holder_may_launch(request, running, notebook, who, code, words):
    response = launch(request.getfixturevalue(who), running, notebook)
    assert response.status_code == code
    assert words in response.json()["error"]["message"]
    assert not Launch.objects.exists()


def test_bad_launches_are_refused_with_words_and_leave_nothing(alice, gpus, running, notebook, clock):
    notebook_off = Environment.objects.create(name="Old TF", image="lab/tf:1.15", command=["python"], enabled=False)
    client = client_for(alice)
    cases = [
        ({"reservation": running.pk, "environment": notebook_off.pk}, 400, "No environment #"),
        ({"reservation": running.pk, "environment": 999999}, 400, "No environment #"),
        ({"reservation": running.pk}, 400, "This field is required"),
        ({"reservation": "x", "environment": notebook.pk}, 400, "valid integer"),
    ]
    for body, code, words in cases:
        response = client.post(LAUNCHES, body, format="json")
        assert response.status_code == code, (body, response.content)
        assert words in str(response.json()), (body, response.json())
    cancelled = reservation_cancel(
        reservation=reservation_create(user=alice, gpus=gpus[3:], start=at(5), end=at(6)), actor=alice
    )
    response = launch(alice, cancelled, notebook)
    assert response.status_code == 409
    assert "is cancelled" in response.json()["error"]["message"]
    for _ in range(protocol.MAX_LAUNCHES):
        assert launch(alice, running, notebook).status_code == 201
    response = launch(alice, running, notebook)
    assert response.status_code == 409
    assert "stop one first" in response.json()["error"]["message"]
    clock.move_to(at(3))  # the booking is over
    response = launch(alice, running, notebook)
    assert response.status_code == 409
    assert "is over" in response.json()["error"]["message"]
    assert Launch.objects.count() == protocol.MAX_LAUNCHES


def test_the_nodes_heartbeat_brings_state_output_and_connection_and_the_token_is_the_holders_alone(
    alice, carol, node, running, notebook
):
    created = launch(alice, running, notebook).json()
    report = status(running, port=8123, token="s3cret-token", tail="[I] Jupyter Server is running at <token>\n")

    assert heartbeat(node, [report]) == 200

    mine = client_for(alice).get(f"{LAUNCHES}{created['id']}/").json()
    assert (mine["state"], mine["port"], mine["token"]) == ("running", 8123, "s3cret-token")
    assert mine["ssh_tunnel"] == "ssh -N -L 8123:127.0.0.1:8123 alice@" + node.hostname
    assert "Jupyter Server is running" in mine["log_tail"]
    assert mine["started_at"] is not None
    as_admin = client_for(carol).get(f"{LAUNCHES}{created['id']}/").json()
    assert as_admin["state"] == "running" and as_admin["token"] == ""  # admins see it run, not its key

    page = Client()
    page.force_login(alice)
    assert "s3cret-token" in page.get(f"/reservations/{running.pk}/").content.decode()
    page.force_login(carol)
    html = page.get(f"/reservations/{running.pk}/").content.decode()
    assert "Running" in html and "s3cret-token" not in html


def test_a_notebook_on_a_unix_socket_is_reached_by_an_ssh_tunnel_to_that_socket(alice, node, running, notebook):
    """Issue 36: a launch serving on {socket} is shown with the tunnel to its socket path, on the page, in the API
    and by the CLI's API fields; the node reports the path only once it has seen the socket there."""
    created = launch(alice, running, notebook).json()
    path = f"/run/gpubook-launches/gpubook-{running.pk}-1/socket"
    heartbeat(node, [status(running, message="waiting for it to listen on its socket (no socket yet)")])
    waiting = client_for(alice).get(f"{LAUNCHES}{created['id']}/").json()
    assert (waiting["ssh_tunnel"], waiting["local_url"], waiting["socket"]) == ("", "", "")

    assert heartbeat(node, [status(running, socket=path, token="s3cret-token")]) == 200

    mine = client_for(alice).get(f"{LAUNCHES}{created['id']}/").json()
    assert (mine["socket"], mine["port"], mine["token"]) == (path, None, "s3cret-token")
    assert mine["ssh_tunnel"] == f"ssh -N -L 8888:{path} alice@{node.hostname}"
    assert mine["local_url"] == "http://127.0.0.1:8888/"
    page = Client()
    page.force_login(alice)
    html = page.get(f"/reservations/{running.pk}/").content.decode()
    assert f"ssh -N -L 8888:{path} alice@{node.hostname}" in html
    assert "a Unix socket on the node that only your account can reach" in html


@pytest.mark.parametrize("path", ["/run/x; rm -rf ~", "relative/socket", "/run/$(id)/socket", "/" + "x" * 120])
def test_a_socket_path_a_shell_would_read_is_refused_from_the_node(alice, node, running, notebook, path):
    """The path goes into a command its holder pastes into a shell: a node (perhaps a hostile one) may send only a
    plain absolute path."""
    launch(alice, running, notebook)

    assert heartbeat(node, [status(running, socket=path)]) == 400

    assert Launch.objects.get().socket == ""


def test_a_node_speaks_only_for_launches_of_bookings_on_itself(alice, running, notebook):
    launch(alice, running, notebook)
    elsewhere = node_with_gpus(1, name="gpu-4090")

    assert heartbeat(elsewhere, [status(running, state="exited", exit_code=0)]) == 200

    assert Launch.objects.get().state == Launch.State.REQUESTED


def test_an_ended_launch_stays_ended_whatever_a_late_heartbeat_says(alice, node, running, notebook):
    launch(alice, running, notebook)
    heartbeat(node, [status(running, state="exited", exit_code=3, message="exited with code 3")])
    heartbeat(node, [status(running, state="running")])  # sent before the exit, arrived after it

    ended = Launch.objects.get()
    assert (ended.state, ended.exit_code, ended.message) == ("exited", 3, "exited with code 3")
    assert ended.ended_at is not None


def test_stopping_takes_it_out_of_the_lease_and_only_the_holder_or_an_admin_may(
    alice, bob, carol, node, running, notebook
):
    first = launch(alice, running, notebook).json()
    second = launch(alice, running, notebook).json()
    heartbeat(node, [status(running, 1), status(running, 2)])

    assert client_for(bob).post(f"{LAUNCHES}{first['id']}/stop/").status_code == 404  # not his to see
    stopped = client_for(alice).post(f"{LAUNCHES}{first['id']}/stop/")
    assert stopped.status_code == 200 and stopped.json()["stop_requested"] is True
    assert client_for(carol).post(f"{LAUNCHES}{second['id']}/stop/").status_code == 200

    assert "launches" not in lease_of(node, running.pk)  # the node ends both (and says so in its heartbeat)
    heartbeat(node, [status(running, 1, state="stopped", message="stopped from the portal", exit_code=-15)])
    response = client_for(alice).post(f"{LAUNCHES}{first['id']}/stop/")
    assert response.status_code == 409
    assert "stopped already" in response.json()["error"]["message"]


def test_a_booking_cancelled_before_its_slot_ends_its_waiting_launches(alice, gpus, notebook):
    later = reservation_create(user=alice, gpus=gpus[2:3], start=at(3), end=at(4))
    launch(alice, later, notebook)

    reservation_cancel(reservation=later, actor=alice)

    waiting = Launch.objects.get()
    assert (waiting.state, waiting.message) == ("stopped", "the booking was cancelled")


def test_the_booking_page_launches_and_stops_through_its_forms(alice, node, running, notebook):
    page = Client()
    page.force_login(alice)
    here = f"/reservations/{running.pk}/"
    html = page.get(here).content.decode()
    assert 'id="environments"' in html and "Jupyter, PyTorch 2.5" in html

    response = page.post(f"{here}environments/launch/", {"environment": notebook.pk, "next": here}, follow=True)
    assert "Jupyter, PyTorch 2.5 will start on gpu-a100 now." in response.content.decode()
    created = Launch.objects.get()

    response = page.post(f"/launches/{created.pk}/stop/", {"next": here}, follow=True)
    assert "is being stopped" in response.content.decode()
    created.refresh_from_db()
    assert created.stop_requested_at == MONDAY_9
    response = page.post(f"{here}environments/launch/", {"environment": "nonsense", "next": here}, follow=True)
    assert "Pick one of the environments listed." in response.content.decode()


def test_launch_events_are_stored_and_shown_on_the_booking(alice, node, running, notebook):
    launch(alice, running, notebook)
    client = Client(HTTP_AUTHORIZATION=f"Bearer {node_rotate_credentials(node=node).agent_token}")
    event = protocol.event(
        "launch_exited",
        {"reservation": running.pk, "user": "alice", "launch": 1, "exit_code": 3, "message": "exited with code 3"},
    )
    response = client.post("/api/v1/agent/events/", protocol.events([event]), content_type="application/json")
    assert response.status_code == 200, response.content

    page = Client()
    page.force_login(alice)
    html = page.get(f"/reservations/{running.pk}/").content.decode()
    assert "Environment exited (launch 1): exited with code 3" in html


def test_launches_of_a_booking_that_ended_without_word_from_its_node_are_closed_and_their_token_dropped(
    alice, gpus, node, notebook, clock
):
    quiet = reservation_create(user=alice, gpus=gpus[:1], start=at(0), end=at(1))
    launch(alice, quiet, notebook)
    heartbeat(node, [status(quiet, port=8123, token="s3cret")])  # running; then the node goes silent

    assert launches_close_overdue(now=at(1)) == 0  # the slot just ended: the node gets its time to say so
    assert launches_close_overdue(now=at(1.25)) == 1

    closed = Launch.objects.get()
    assert (closed.state, closed.token) == ("stopped", "")
    assert "its node has not said how this ended" in closed.message
    assert launches_close_overdue(now=at(2)) == 0  # idempotent


def test_a_final_report_drops_the_token_and_the_portal_masks_it_in_the_output_too(alice, node, running, notebook):
    launch(alice, running, notebook)
    heartbeat(node, [status(running, port=8123, token="s3cret", tail="at http://127.0.0.1:8123/?token=s3cret\n")])
    shown = Launch.objects.get()
    assert shown.token == "s3cret" and "s3cret" not in shown.log_tail  # an agent that forgot to mask it

    heartbeat(node, [status(running, state="exited", exit_code=0, token="s3cret")])
    assert Launch.objects.get().token == ""


def test_admins_see_launches_in_django_admin_without_their_token_and_stop_them_there(
    alice, carol, node, running, notebook
):
    launch(alice, running, notebook)
    heartbeat(node, [status(running, port=8123, token="s3cret")])
    launched = Launch.objects.get()
    page = Client()
    page.force_login(carol)

    listing = page.get("/admin/environments/launch/")
    assert listing.status_code == 200 and "Jupyter, PyTorch 2.5" in listing.content.decode()
    detail = page.get(f"/admin/environments/launch/{launched.pk}/change/")
    assert detail.status_code == 200 and "s3cret" not in detail.content.decode()
    assert page.get("/admin/environments/launch/add/").status_code == 403

    page.post("/admin/environments/launch/", {"action": "stop", "_selected_action": [launched.pk]})

    launched.refresh_from_db()
    assert launched.stop_requested_by == carol


def test_a_cancelled_bookings_launch_waits_for_its_nodes_word_before_the_portal_closes_it(
    alice, carol, gpus, node, notebook
):
    later = reservation_create(user=alice, gpus=gpus[2:3], start=at(0), end=at(4))
    launch(alice, later, notebook)
    heartbeat(node, [status(later)])  # running, reported at 09:00
    reservation_cancel(reservation=later, actor=carol)  # an admin may cancel a running booking

    assert launches_close_overdue(now=at(0.05)) == 0  # the node says "stopped" within seconds, with its exit code
    assert launches_close_overdue(now=at(0.25)) == 1  # it stayed silent


def test_a_booking_has_at_most_so_many_launches_in_all(alice, node, running, notebook):
    for _ in range(MAX_LAUNCHES_PER_BOOKING):
        created = launch(alice, running, notebook).json()
        client_for(alice).post(f"{LAUNCHES}{created['id']}/stop/")
    refused = launch(alice, running, notebook)
    assert refused.status_code == 409
    assert f"has had {MAX_LAUNCHES_PER_BOOKING} launches" in refused.json()["error"]["message"]


def test_an_id_that_is_not_plain_digits_is_a_400_not_a_500(alice, running, notebook):
    assert client_for(alice).get(LAUNCHES, {"reservation": "²"}).status_code == 400
    page = Client()
    page.force_login(alice)
    here = f"/reservations/{running.pk}/"
    response = page.post(f"{here}environments/launch/", {"environment": "²", "next": here}, follow=True)
    assert "Pick one of the environments listed." in response.content.decode()


def test_a_booking_on_a_slurm_node_launches_nothing_and_says_where_to_run_instead(alice, notebook):
    slurm = node_with_gpus(2, name="slurm-a100")
    Node.objects.filter(pk=slurm.pk).update(manager=Node.Manager.SLURM)
    booking = reservation_create(user=alice, gpus=list(slurm.gpus.all()), start=at(0), end=at(2))

    refused = launch(alice, booking, notebook)

    assert refused.status_code == 409
    assert "managed by Slurm: run your environment as a Slurm job" in refused.json()["error"]["message"]
    assert not Launch.objects.exists()
