"""A deactivated account keeps nothing: no lease from the moment it is inactive, its future bookings
cancelled and running ones released (audited), whichever way it was deactivated."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

from accounts.models import User
from accounts.services import user_deactivate
from audit.models import AuditEntry
from reservations.leases import node_leases
from reservations.models import Reservation
from reservations.tasks import end_inactive_bookings
from tests.conftest import at
from tests.factories import book
from tests.test_settings import run

pytestmark = pytest.mark.usefixtures("clock")
Status = Reservation.Status
REASON = "the account was deactivated"


NOW = at(0.5)


@pytest.fixture
def bookings(alice, bob, gpus, clock):
    """At NOW, alice has one booking running, one tomorrow and one long over; bob one running."""
    running = book(alice, gpus[:1], at(0), at(3))
    later = book(alice, gpus[1:2], at(24), at(26))
    past = book(alice, gpus[3:4], at(-5), at(-4), direct=True)
    other = book(bob, gpus[2:3], at(0), at(2))
    clock.move_to(NOW)
    return running, later, past, other


def states(*reservations) -> list[tuple[str, object]]:
    out = []
    for reservation in reservations:
        reservation.refresh_from_db()
        out.append((reservation.status, reservation.end))
    return out


def assert_ended(bookings) -> None:
    running, later, past, other = bookings
    assert states(running, later, past, other) == [
        (Status.APPROVED, NOW),  # released now
        (Status.CANCELLED, at(26)),
        (Status.APPROVED, at(-4)),  # history stays as it was
        (Status.APPROVED, at(2)),  # someone else's
    ]
    assert running.released_at == NOW
    assert later.cancel_reason == REASON
    entries = AuditEntry.objects.filter(reason=REASON, action__in=["reservation.release", "reservation.cancel"])
    assert sorted(entries.values_list("action", "target_id")) == [
        ("reservation.cancel", str(later.pk)),
        ("reservation.release", str(running.pk)),
    ]


def test_an_admin_unticking_active_ends_the_bookings(bookings, alice, carol, django_capture_on_commit_callbacks):
    admin = Client()
    admin.force_login(carol)
    url = reverse("admin:accounts_user_change", args=[alice.pk])
    form = admin.get(url).context["adminform"].form
    data = {name: value for name, value in form.initial.items() if value is not None and name != "password"}
    data.update(
        {
            "is_active": "",
            "date_joined_0": alice.date_joined.strftime("%Y-%m-%d"),
            "date_joined_1": alice.date_joined.strftime("%H:%M:%S"),
            "groups": [],
            "user_permissions": [],
        }
    )
    data = {key: value for key, value in data.items() if key not in ("date_joined", "last_login", "is_active")}

    with django_capture_on_commit_callbacks(execute=True):
        response = admin.post(url, data)

    assert response.status_code == 302, response.context["adminform"].form.errors
    alice.refresh_from_db()
    assert not alice.is_active
    assert_ended(bookings)


def test_a_plain_save_does_it_too(bookings, alice, django_capture_on_commit_callbacks):
    """django-auth-ldap (LDAP_ACTIVE_GROUP), scripts and the shell all end with save()."""
    alice.is_active = False
    with django_capture_on_commit_callbacks(execute=True):
        alice.save()

    assert_ended(bookings)
    assert AuditEntry.objects.filter(action="user.deactivate", target_id=str(alice.pk)).count() == 1


def test_the_management_command_does_it(bookings, alice, django_capture_on_commit_callbacks):
    out = StringIO()
    with django_capture_on_commit_callbacks(execute=True):
        call_command("deactivate_user", "alice", "--reason", "left the lab", stdout=out)

    assert out.getvalue() == "alice deactivated: their bookings end and their GPUs close.\n"
    assert_ended(bookings)
    assert AuditEntry.objects.get(action="user.deactivate").reason == "left the lab"
    out = StringIO()
    call_command("deactivate_user", "alice", stdout=out)
    assert out.getvalue() == "alice was already inactive.\n"


def test_the_leases_leave_an_inactive_person_out_at_once(bookings, alice, node):
    """Before anything reacts (here: an update that bypasses save()), the node's state has no grant."""
    assert {lease["user"] for lease in node_leases(node=node, now=NOW)} == {"alice", "bob"}

    User.objects.filter(pk=alice.pk).update(is_active=False)

    assert {lease["user"] for lease in node_leases(node=node, now=NOW)} == {"bob"}


def test_beats_sweep_ends_what_a_bypassing_write_left(bookings, alice):
    User.objects.filter(pk=alice.pk).update(is_active=False)

    assert end_inactive_bookings() == 2

    assert_ended(bookings)
    assert end_inactive_bookings() == 0  # idempotent


def test_a_reactivated_person_keeps_what_is_left(bookings, alice, django_capture_on_commit_callbacks):
    user_deactivate(user=alice, actor=None)  # its reaction has not run (no commit here) ...
    User.objects.filter(pk=alice.pk).update(is_active=True)  # ... and an admin changed their mind

    assert end_inactive_bookings() == 0
    running, later, _, _ = bookings
    assert states(running, later) == [(Status.APPROVED, at(3)), (Status.APPROVED, at(26))]


def test_ldap_active_group_maps_to_the_is_active_flag(tmp_path):
    pytest.importorskip("django_auth_ldap", reason="the sso extra is not installed")
    env = {
        "LDAP_SERVER_URI": "ldaps://ldap.example.org",
        "LDAP_USER_SEARCH_BASE": "ou=people,dc=example,dc=org",
        "LDAP_ACTIVE_GROUP": "cn=gpu-users,ou=groups,dc=example,dc=org",
    }
    code = (
        "import django; django.setup(); from django.conf import settings as s; print(s.AUTH_LDAP_USER_FLAGS_BY_GROUP)"
    )
    done = run(["-c", code], tmp_path, **env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "{'is_active': 'cn=gpu-users,ou=groups,dc=example,dc=org'}"
