from __future__ import annotations

from datetime import timedelta
from io import StringIO

from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.utils import timezone

from nodes.models import Gpu, Node
from reservations.demo_jobs import LEFT_IDLE_PURPOSE
from reservations.models import Reservation


def test_the_demo_lab_is_created_once_and_passwords_are_shown_once(db):
    first = StringIO()
    call_command("demo_lab", stdout=first)
    second = StringIO()
    call_command("demo_lab", stdout=second)

    assert first.getvalue().count("(shown once)") == 3
    assert "password" not in second.getvalue()
    assert sorted(Node.objects.values_list("name", flat=True)) == ["gpu-4090", "gpu-a100"]
    assert Gpu.objects.filter(parent=None).count() == 8
    # gpu-a100's GPU 0 is split with MIG, its layout confirmed: the simulated agent's (demo_agents).
    mig_card = Gpu.objects.get(node__name="gpu-a100", index=0, parent=None)
    assert mig_card.mig_mode
    assert [(s.profile, s.placement_start, s.bookable) for s in mig_card.slices.order_by("placement_start")] == [
        ("2g.20gb", 0, True),
        ("2g.20gb", 2, True),
        ("3g.40gb", 4, True),
    ]
    assert get_user_model().objects.count() == 3
    assert Reservation.objects.filter(status="pending").count() == 1
    assert Reservation.objects.count() == 7
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


def test_the_demo_starts_with_bookings_running_on_both_nodes(db):
    call_command("demo_lab", stdout=StringIO())
    now = timezone.now()
    running = Reservation.objects.filter(status="approved", start__lte=now, end__gt=now)
    assert sorted({reservation.node.name for reservation in running}) == ["gpu-4090", "gpu-a100"]
    assert {reservation.user.unix_username for reservation in running} == {"demo-alice", "demo-bob", "demo-carol"}
    assert any(a.gpu.parent_id for r in running for a in r.allocations.all())  # one on a MIG slice
    # One is left without a job on purpose, so that the idle alert has a booking to flag.
    assert [reservation.purpose for reservation in running if reservation.purpose == LEFT_IDLE_PURPOSE] == [
        LEFT_IDLE_PURPOSE
    ]


def test_a_demo_started_again_after_its_bookings_are_over_books_again(db, time_machine):
    time_machine.move_to(timezone.now(), tick=False)
    call_command("demo_lab", stdout=StringIO())
    call_command("demo_lab", stdout=StringIO())  # still running: nothing new
    assert Reservation.objects.count() == 7

    time_machine.shift(timedelta(days=3))  # every demo booking is over, bob's pending one too
    out = StringIO()
    call_command("demo_lab", stdout=out)
    assert "booked 7 demo reservations" in out.getvalue()
    assert Reservation.objects.count() == 14
    now = timezone.now()
    assert Reservation.objects.filter(status="approved", start__lte=now, end__gt=now).count() == 5


def test_a_demo_made_by_an_older_plan_gets_the_bookings_it_lacks(db):
    call_command("demo_lab", stdout=StringIO())
    Reservation.objects.filter(purpose=LEFT_IDLE_PURPOSE).delete()  # as the plan before the idle example left it

    out = StringIO()
    call_command("demo_lab", stdout=out)

    assert "booked 1 demo reservations" in out.getvalue()
    assert Reservation.objects.filter(purpose=LEFT_IDLE_PURPOSE, status="approved").count() == 1
    assert Reservation.objects.count() == 7
