"""``gpubook environments``, ``launch``, ``launches``, ``launch-log``, ``launch-stop``: a real subprocess against a live
portal (tests/test_cli.py); the node's part is played by posting its heartbeat with its token."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from environments.models import Environment, Launch
from gpubook_agent import protocol
from nodes.services import node_rotate_credentials
from reservations.models import Reservation
from reservations.services import reservation_create
from tests.factories import node_with_gpus
from tests.test_cli import assert_clean_failure, cli_for, start  # noqa: F401 - fixtures

pytestmark = pytest.mark.django_db(transaction=True)


def test_list_launch_follow_and_stop_an_environment(cli_for, alice, bob, start):  # noqa: F811
    node = node_with_gpus(2, name="gpu-a100")
    booking = reservation_create(
        user=alice, gpus=list(node.gpus.all()[:1]), start=start, end=start + timedelta(hours=2)
    )
    Environment.objects.create(name="Jupyter", image="lab/jupyter:1", command=["jupyter", "lab", "--port={port}"])
    run = cli_for(alice)

    listed = run("environments")
    assert listed.returncode == 0, listed.stderr
    assert "Jupyter" in listed.stdout and "lab/jupyter:1" in listed.stdout

    launched = run("launch", booking.pk, "jupyter")  # by name, whatever its case
    assert launched.returncode == 0, launched.stderr
    launch = Launch.objects.get()
    assert launched.stdout.startswith(f"Launched: #{launch.pk} Jupyter in reservation #{booking.pk} on gpu-a100: ")

    token = node_rotate_credentials(node=node).agent_token
    report = {"reservation": booking.pk, "number": 1, "state": "running", "exit_code": None, "message": "",
              "port": 8123, "token": "s3cret", "tail": "serving\n"}  # fmt: skip
    body = protocol.heartbeat(
        backend="simulated", driver_version=None, applied_version=0, acls={}, launches=[report], sent_at=timezone.now()
    )
    agent = Client(HTTP_AUTHORIZATION=f"Bearer {token}")
    assert agent.post("/api/v1/agent/heartbeat/", body, content_type="application/json").status_code == 200

    shown = run("launch-log", launch.pk)
    assert shown.returncode == 0, shown.stderr
    assert f"connect: ssh -N -L 8123:127.0.0.1:8123 alice@{node.hostname}" in shown.stdout
    assert "then open http://127.0.0.1:8123/" in shown.stdout
    assert "token: s3cret" in shown.stdout and "serving" in shown.stdout
    assert "Running" in run("launches", "--reservation", booking.pk).stdout

    assert_clean_failure(cli_for(bob)("launch-stop", launch.pk), 1)  # not his: the portal's 404, in words
    stopped = run("launch-stop", launch.pk)
    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stdout.startswith(f"Stopping: #{launch.pk} Jupyter") and "stopping" in stopped.stdout

    unknown = run("launch", booking.pk, "TensorFlow")
    assert_clean_failure(unknown, 1)
    assert "No environment named 'TensorFlow'. Offered: Jupyter." in unknown.stderr


def test_book_with_launch_asks_for_the_environment_at_booking_time_and_refuses_an_unknown_one_first(
    cli_for,  # noqa: F811
    alice,
    start,  # noqa: F811
):
    gpu = node_with_gpus(2, name="gpu-a100").gpus.order_by("index").first()
    Environment.objects.create(name="Jupyter", image="lab/jupyter:1", command=["jupyter", "lab", "--port={port}"])
    run = cli_for(alice)
    times = ("--start", start.isoformat(), "--hours", "2")

    unknown = run("book", "--gpu-ids", gpu.pk, *times, "--launch", "TensorFlow")
    assert_clean_failure(unknown, 1)
    assert "No environment named 'TensorFlow'" in unknown.stderr
    assert not Reservation.objects.exists()  # refused before anything was booked

    booked = run("book", "--gpu-ids", gpu.pk, *times, "--launch", "Jupyter")
    assert booked.returncode == 0, booked.stderr
    launch = Launch.objects.get()
    assert launch.reservation.start == start and launch.state == Launch.State.REQUESTED
    assert f"note: launch #{launch.pk} Jupyter: starts with the slot" in booked.stderr
