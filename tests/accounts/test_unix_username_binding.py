"""Who sets the unix username (UNIX_USERNAME_SOURCE), and that nothing is granted for a request
until an admin confirms it: on the approvals page, in Django admin, in the services."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from accounts.models import User
from accounts.services import (
    UnixUsernameError,
    UnixUsernameTaken,
    unix_username_confirm,
    unix_username_refuse,
    unix_username_request,
)
from audit.models import AuditEntry
from kernel.redis_client import redis_client
from reservations.exceptions import InvalidBooking
from reservations.leases import node_leases
from reservations.pushes import PENDING_KEY
from reservations.services import reservation_create
from tests.conftest import MONDAY_9, at
from tests.factories import UserFactory

pytestmark = pytest.mark.usefixtures("clock")
PENDING = reverse("pending-approvals")


@pytest.fixture
def newcomer(db):
    return UserFactory(username="dana", unix_username=None)


def admin_client(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def lease_users(node) -> set[str]:
    return {lease["user"] for lease in node_leases(node=node, now=MONDAY_9)}


def test_a_request_holds_a_slot_but_opens_nothing_until_confirmed(newcomer, carol, gpus, node):
    unix_username_request(user=newcomer, name="dana_lab", actor=newcomer)
    reservation_create(user=newcomer, gpus=gpus[:1], start=at(0), end=at(2))  # allowed: the slot is held

    assert lease_users(node) == set()

    unix_username_confirm(user=newcomer, name="dana_lab", actor=carol)

    newcomer.refresh_from_db()
    assert (newcomer.unix_username, newcomer.unix_username_requested) == ("dana_lab", "")
    assert lease_users(node) == {"dana_lab"}
    assert AuditEntry.objects.filter(action="user.unix_username.confirm", actor=carol).count() == 1


def test_without_a_name_or_a_request_booking_says_how_to_get_one(newcomer, gpus):
    with pytest.raises(InvalidBooking, match=r"Request one in your profile; an admin confirms it\."):
        reservation_create(user=newcomer, gpus=gpus[:1], start=at(0), end=at(2))


def test_a_colleagues_name_cannot_be_taken_by_asking(alice, newcomer):
    with pytest.raises(UnixUsernameTaken, match="already the unix username of another portal account"):
        unix_username_request(user=newcomer, name="alice", actor=newcomer)


def test_a_name_nobody_holds_yet_still_needs_an_admin(newcomer, node, gpus, carol):
    """bob_real is a colleague's account on the nodes who has no portal account yet: dana asking for
    it grants nothing by itself; the admin who knows the lab refuses it."""
    unix_username_request(user=newcomer, name="bob_real", actor=newcomer)
    reservation_create(user=newcomer, gpus=gpus[:1], start=at(0), end=at(2))
    assert lease_users(node) == set()

    unix_username_refuse(user=newcomer, actor=carol, reason="that is Bob's account")

    newcomer.refresh_from_db()
    assert (newcomer.unix_username, newcomer.unix_username_requested) == (None, "")
    assert AuditEntry.objects.get(action="user.unix_username.refuse").reason == "that is Bob's account"


def test_a_changed_request_is_not_confirmed_blindly(newcomer, carol):
    unix_username_request(user=newcomer, name="dana_lab", actor=newcomer)
    unix_username_request(user=newcomer, name="dana_x", actor=newcomer)  # after the admin loaded the page

    with pytest.raises(UnixUsernameError, match="no longer asks for 'dana_lab' \\(now: dana_x\\)"):
        unix_username_confirm(user=newcomer, name="dana_lab", actor=carol)
    newcomer.refresh_from_db()
    assert newcomer.unix_username is None


def test_two_people_asking_for_one_name_only_the_first_confirmed_gets_it(newcomer, carol):
    other = UserFactory(username="erin", unix_username=None)
    unix_username_request(user=newcomer, name="shared", actor=newcomer)
    unix_username_request(user=other, name="shared", actor=other)
    unix_username_confirm(user=newcomer, name="shared", actor=carol)

    with pytest.raises(UnixUsernameTaken, match="'shared' is already the unix username of dana"):
        unix_username_confirm(user=other, name="shared", actor=carol)


def test_researchers_cannot_confirm_or_set(newcomer, alice):
    unix_username_request(user=newcomer, name="dana_lab", actor=newcomer)
    with pytest.raises(UnixUsernameError, match="Only admins"):
        unix_username_confirm(user=newcomer, name="dana_lab", actor=alice)
    with pytest.raises(UnixUsernameError, match="Only admins"):
        unix_username_refuse(user=newcomer, actor=newcomer)


@pytest.mark.parametrize("name", ["root", "www-data", "postgres", "Dana", "../x"])
def test_confirming_checks_the_name_again(newcomer, carol, name):
    """A request that reached the database some other way (an older portal, a script) is checked
    once more when an admin confirms it."""
    User.objects.filter(pk=newcomer.pk).update(unix_username_requested=name)

    with pytest.raises(UnixUsernameError):
        unix_username_confirm(user=newcomer, name=name, actor=carol)

    newcomer.refresh_from_db()
    assert newcomer.unix_username is None


def test_with_the_directory_as_source_nobody_sets_it_in_the_portal(newcomer, carol, settings):
    settings.UNIX_USERNAME_SOURCE = "directory"
    with pytest.raises(UnixUsernameError, match="You cannot choose"):
        unix_username_request(user=newcomer, name="dana_lab", actor=newcomer)
    User.objects.filter(pk=newcomer.pk).update(unix_username_requested="dana_lab")
    with pytest.raises(UnixUsernameError, match="come from the directory"):
        unix_username_confirm(user=newcomer, name="dana_lab", actor=carol)


def test_a_confirmed_change_sends_the_nodes_their_new_state(
    alice, carol, gpus, node, django_capture_on_commit_callbacks
):
    reservation_create(user=alice, gpus=gpus[:1], start=at(0), end=at(2))
    redis_client().delete(PENDING_KEY.format(node_id=node.pk))
    unix_username_request(user=alice, name="alice_gpu", actor=alice)

    with django_capture_on_commit_callbacks(execute=True):
        unix_username_confirm(user=alice, name="alice_gpu", actor=carol)

    assert lease_users(node) == {"alice_gpu"}
    assert redis_client().get(PENDING_KEY.format(node_id=node.pk))  # a push is queued for the node


# --- the approvals page and Django admin ------------------------------------------------------------


def test_the_approvals_page_lists_requests_with_warnings_and_confirms_them(newcomer, alice, carol):
    unix_username_request(user=newcomer, name="dana_lab", actor=newcomer)
    erin = UserFactory(username="erin", unix_username="erin")
    unix_username_request(user=erin, name="dana_lab", actor=erin)
    client = admin_client(carol)

    html = client.get(PENDING).content.decode()
    assert "Unix usernames to confirm" in html
    assert "Confirm dana_lab for dana" in html
    assert "also requested by 1 other person" in html
    assert "replaces erin, whose GPUs close when it is confirmed" in html

    response = client.post(
        reverse("unix-username-decide", args=[newcomer.pk, "confirm"]), {"name": "dana_lab"}, follow=True
    )
    assert [str(m) for m in response.context["messages"]] == [
        "dana's unix username is now dana_lab: their GPUs open for it."
    ]
    response = client.post(
        reverse("unix-username-decide", args=[erin.pk, "confirm"]), {"name": "dana_lab"}, follow=True
    )
    assert [str(m) for m in response.context["messages"]] == ["erin: 'dana_lab' is already the unix username of dana."]
    erin.refresh_from_db()
    assert (erin.unix_username, erin.unix_username_requested) == ("erin", "dana_lab")


def test_researchers_cannot_decide_requests(newcomer, alice):
    unix_username_request(user=newcomer, name="dana_lab", actor=newcomer)
    client = admin_client(alice)

    response = client.post(reverse("unix-username-decide", args=[newcomer.pk, "confirm"]), {"name": "dana_lab"})

    assert response.status_code == 403
    newcomer.refresh_from_db()
    assert newcomer.unix_username is None


def test_django_admin_confirms_by_typing_the_name_and_refuses_in_bulk(newcomer, alice, carol):
    unix_username_request(user=newcomer, name="dana_lab", actor=newcomer)
    erin = UserFactory(username="erin", unix_username=None)
    unix_username_request(user=erin, name="erin_gpu", actor=erin)
    client = admin_client(carol)
    changelist = reverse("admin:accounts_user_changelist")
    html = client.get(f"{changelist}?unix_request=waiting").content.decode()
    assert "dana_lab" in html and "erin_gpu" in html
    assert "confirm_unix_usernames" not in html  # no bulk confirm: it would confirm what the owner changed since

    url = reverse("admin:accounts_user_change", args=[newcomer.pk])
    form = client.get(url).context["adminform"].form
    data = {k: v for k, v in form.initial.items() if v is not None and k not in ("password", "last_login")}
    data.update(
        unix_username="dana_lab",
        date_joined_0=newcomer.date_joined.strftime("%Y-%m-%d"),
        date_joined_1=newcomer.date_joined.strftime("%H:%M:%S"),
        groups=[],
        user_permissions=[],
    )
    data.pop("date_joined", None)
    assert client.post(url, data).status_code == 302
    client.post(changelist, {"action": "refuse_unix_usernames", "_selected_action": [erin.pk]}, follow=True)

    newcomer.refresh_from_db()
    erin.refresh_from_db()
    assert (newcomer.unix_username, newcomer.unix_username_requested) == ("dana_lab", "")
    assert (erin.unix_username, erin.unix_username_requested) == (None, "")


def test_refusing_on_the_approvals_page_refuses_only_the_name_the_admin_saw(newcomer, carol):
    unix_username_request(user=newcomer, name="dana_lab", actor=newcomer)
    unix_username_request(user=newcomer, name="dana_x", actor=newcomer)  # after the page loaded

    response = admin_client(carol).post(
        reverse("unix-username-decide", args=[newcomer.pk, "refuse"]), {"name": "dana_lab"}, follow=True
    )

    (message,) = [str(m) for m in response.context["messages"]]
    assert "no longer asks for 'dana_lab'" in message
    newcomer.refresh_from_db()
    assert newcomer.unix_username_requested == "dana_x"


def test_django_admin_shows_the_unix_username_read_only_with_the_directory_as_source(alice, carol, settings):
    settings.UNIX_USERNAME_SOURCE = "directory"
    html = admin_client(carol).get(reverse("admin:accounts_user_change", args=[alice.pk])).content.decode()
    assert 'name="unix_username"' not in html
    assert "alice" in html


def test_a_directory_source_without_a_directory_is_reported(settings):
    from accounts.checks import check_unix_username_source

    settings.UNIX_USERNAME_SOURCE = "directory"
    settings.LDAP_SERVER_URI = ""
    settings.OIDC_ENABLED, settings.OIDC_UNIX_USERNAME_CLAIM = True, ""
    assert [message.id for message in check_unix_username_source()] == ["accounts.W001"]

    settings.OIDC_UNIX_USERNAME_CLAIM = "uid"
    assert check_unix_username_source() == []
    settings.UNIX_USERNAME_SOURCE = "request"
    settings.OIDC_UNIX_USERNAME_CLAIM = ""
    assert check_unix_username_source() == []
