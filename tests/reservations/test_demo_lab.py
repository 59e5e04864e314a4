from __future__ import annotations

from io import StringIO

from django.contrib.auth import get_user_model
from django.core.management import call_command

from nodes.models import Gpu, Node
from reservations.models import Reservation


def test_the_demo_lab_is_created_once_and_passwords_are_shown_once(db):
    first = StringIO()
    call_command("demo_lab", stdout=first)
    second = StringIO()
    call_command("demo_lab", stdout=second)

    assert first.getvalue().count("(shown once)") == 3
    assert "password" not in second.getvalue()
    assert sorted(Node.objects.values_list("name", flat=True)) == ["gpu-4090", "gpu-a100"]
    assert Gpu.objects.count() == 8
    assert get_user_model().objects.count() == 3
    assert Reservation.objects.filter(status="pending").count() == 1
    assert Reservation.objects.count() == 4
    carol = get_user_model().objects.get(username="carol")
    assert carol.is_booking_admin


def test_demo_passwords_work(db, client):
    out = StringIO()
    call_command("demo_lab", stdout=out)
    line = next(line for line in out.getvalue().splitlines() if "'alice'" in line)
    password = line.split("password '")[1].split("'")[0]
    # Through the login form, as a person would (client.login passes no request, which the login throttle needs).
    done = client.post("/accounts/login/", {"username": "alice", "password": password})
    assert done.status_code == 302
    assert "_auth_user_id" in client.session
