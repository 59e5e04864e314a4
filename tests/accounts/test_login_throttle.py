"""Login throttling (accounts/throttling.py, django-axes fully on): lockouts per username and per
address, the message that says when to retry, Django admin's login, unlocking, and a lockout seen by
another web process. The LDAP directory's side is in test_ldap_directory.py."""

from __future__ import annotations

from datetime import timedelta

import pytest
import requests
from axes.models import AccessAttempt
from django.core.management import call_command
from django.test import Client

from tests.factories import UserFactory
from tests.test_settings import read_settings, run

PASSWORD = "correct horse battery staple"  # the factories' password
LOGIN = "/accounts/login/"
ADMIN_LOGIN = "/admin/login/"


def log_in(client: Client, username: str, password: str, url: str = LOGIN, **extra: str):
    return client.post(url, {"username": username, "password": password}, **extra)


def logged_in(client: Client) -> bool:
    return "_auth_user_id" in client.session


def fail(client: Client, username: str, times: int, url: str = LOGIN, **extra: str) -> None:
    for _ in range(times):
        log_in(client, username, "not the password", url, **extra)


def test_the_sixth_attempt_with_the_right_password_after_five_wrong_ones_is_refused_and_says_when(clock, client, alice):
    for _ in range(4):
        wrong = log_in(client, "alice", "not the password")
        assert wrong.status_code == 200
        assert "That username and password do not match" in wrong.content.decode()

    fifth = log_in(client, "alice", "not the password")  # reaches the limit: says so at once
    assert fifth.status_code == 429
    assert "Too many failed logins" in fifth.content.decode()

    sixth = log_in(client, "alice", PASSWORD)

    assert sixth.status_code == 429
    page = sixth.content.decode()
    assert "Too many failed logins for this username or from your address." in page
    assert "Try again in 15 minutes, at 09:15 UTC, or ask an administrator to unlock it." in page
    assert 'role="alert"' in page and 'name="password"' in page  # the login page itself, form and all
    assert sixth["Retry-After"] == "901"  # axes counts a failure exactly 15 minutes old: a second more
    assert not logged_in(client)


def test_the_lockout_ends_when_the_page_said_and_attempts_meanwhile_do_not_move_it(clock, client, alice):
    fail(client, "alice", 5)

    clock.shift(timedelta(minutes=10))
    meanwhile = log_in(client, "alice", "another guess")
    assert meanwhile.status_code == 429
    assert "Try again in 5 minutes, at 09:15 UTC" in meanwhile.content.decode()
    assert meanwhile["Retry-After"] == "301"

    clock.shift(timedelta(minutes=5))
    assert log_in(client, "alice", PASSWORD).status_code == 429
    clock.shift(timedelta(seconds=1))
    done = log_in(client, "alice", PASSWORD)
    assert done.status_code == 302
    assert logged_in(client)


def test_failures_for_one_username_from_many_addresses_lock_that_username_only(clock, alice, db):
    bob = UserFactory(username="bob")
    for number in range(5):
        fail(Client(REMOTE_ADDR=f"198.51.100.{number + 1}"), "alice", 1)

    elsewhere = Client(REMOTE_ADDR="203.0.113.9")
    assert log_in(elsewhere, "alice", PASSWORD).status_code == 429
    assert log_in(elsewhere, bob.username, PASSWORD).status_code == 302


def test_failures_from_one_address_across_usernames_lock_that_address_only(clock, alice, db):
    sprayer = Client(REMOTE_ADDR="198.51.100.7")
    for name in ("root", "admin", "bob", "carol", "dave"):
        fail(sprayer, name, 1)

    refused = log_in(sprayer, "alice", PASSWORD)
    assert refused.status_code == 429
    assert "Too many failed logins" in refused.content.decode()
    assert log_in(Client(REMOTE_ADDR="198.51.100.8"), "alice", PASSWORD).status_code == 302


def test_changing_the_case_of_a_username_counts_against_the_same_one(clock, client, alice):
    for name in ("alice", "Alice", "ALICE", " alice", "aLiCe"):
        log_in(Client(REMOTE_ADDR="198.51.100.20"), name, "not the password")
    assert log_in(Client(REMOTE_ADDR="198.51.100.21"), "alice", PASSWORD).status_code == 429


def test_fewer_failures_than_the_limit_leave_the_login_alone(clock, client, alice):
    fail(client, "alice", 4)
    assert log_in(client, "alice", PASSWORD).status_code == 302


def test_the_django_admin_login_is_throttled_with_the_portal_login(clock, client, db):
    carol = UserFactory(username="carol", is_staff=True, is_superuser=True)
    fail(client, "carol", 3, url=ADMIN_LOGIN)
    fail(client, "carol", 2)  # the same count, whichever form

    refused = log_in(client, "carol", PASSWORD, url=f"{ADMIN_LOGIN}?next=/admin/")

    assert refused.status_code == 429
    page = refused.content.decode()
    assert "Login locked" in page
    assert "Try again in 15 minutes, at 09:15 UTC" in page
    assert refused["Retry-After"] == "901"
    assert not logged_in(client)
    assert client.get("/admin/").status_code == 302  # still sent to log in
    assert carol.is_staff


def test_an_admin_unlocks_a_username_by_deleting_its_attempts_in_django_admin(clock, client, alice, db):
    fail(client, "alice", 5)
    admin = Client(REMOTE_ADDR="192.0.2.1")
    admin.force_login(UserFactory(username="carol", is_staff=True, is_superuser=True))
    listing = admin.get("/admin/axes/accessattempt/?username=alice")
    assert listing.status_code == 200 and "alice" in listing.content.decode()

    ids = [str(pk) for pk in AccessAttempt.objects.filter(username="alice").values_list("pk", flat=True)]
    done = admin.post(
        "/admin/axes/accessattempt/", {"action": "delete_selected", "_selected_action": ids, "post": "yes"}
    )

    assert done.status_code == 302
    assert log_in(client, "alice", PASSWORD).status_code == 302


def test_the_axes_reset_username_command_unlocks_too(clock, client, alice):
    fail(client, "alice", 5)
    call_command("axes_reset_username", "alice")
    assert log_in(client, "alice", PASSWORD).status_code == 302


def test_a_forwarded_address_is_ignored_unless_the_portal_is_told_it_sits_behind_a_proxy(clock, alice, db):
    for number in range(5):
        forged = {"HTTP_X_FORWARDED_FOR": f"203.0.113.{number}"}
        fail(Client(REMOTE_ADDR="198.51.100.30"), f"user{number}", 1, **forged)
    # A client cannot escape its address's lockout by writing another address in the header.
    assert log_in(Client(REMOTE_ADDR="198.51.100.30"), "alice", PASSWORD).status_code == 429


def test_behind_a_proxy_each_client_is_counted_by_the_address_the_proxy_saw(clock, alice, settings, db):
    settings.NUM_PROXIES = 1
    proxy = {"REMOTE_ADDR": "10.0.0.2"}
    for number in range(5):
        fail(Client(**proxy), f"user{number}", 1, HTTP_X_FORWARDED_FOR=f"1.2.3.4, 198.51.100.{40 + number}")
    assert log_in(Client(**proxy), "alice", PASSWORD, HTTP_X_FORWARDED_FOR="198.51.100.99").status_code == 302
    # ...and the address that failed is locked out, whatever it claims further left in the header.
    fail(Client(**proxy), "user0", 4, HTTP_X_FORWARDED_FOR="198.51.100.40")
    assert log_in(Client(**proxy), "alice", PASSWORD, HTTP_X_FORWARDED_FOR="9.9.9.9, 198.51.100.40").status_code == 429
    # Garbage in the header is no address: REMOTE_ADDR counts, never a 500.
    assert log_in(Client(**proxy), "alice", "wrong", HTTP_X_FORWARDED_FOR="not-an-address").status_code == 200


@pytest.mark.postgres_only
def test_a_lockout_recorded_by_one_process_refuses_the_login_in_another(asgi_server, transactional_db):
    UserFactory(username="alice")
    fail(Client(), "alice", 5)  # this process, this test database

    session = requests.Session()  # the daphne subprocess, its own connections to the same database
    session.get(f"{asgi_server.url}{LOGIN}", timeout=10)
    refused = session.post(
        f"{asgi_server.url}{LOGIN}",
        data={"username": "alice", "password": PASSWORD, "csrfmiddlewaretoken": session.cookies["csrftoken"]},
        headers={"Referer": f"{asgi_server.url}{LOGIN}"},
        allow_redirects=False,
        timeout=10,
    )

    assert refused.status_code == 429
    assert "Too many failed logins" in refused.text
    assert "sessionid" not in session.cookies


# Settings, read by a fresh interpreter as a deployment would.


def test_the_login_throttle_settings_reach_axes(tmp_path):
    values = read_settings(
        tmp_path,
        ["AXES_FAILURE_LIMIT", "AXES_COOLOFF_TIME", "API_TOKEN_FAILURES_PER_MINUTE", "NUM_PROXIES"],
        LOGIN_FAILURE_LIMIT="3",
        LOGIN_LOCKOUT_MINUTES="2",
        API_TOKEN_FAILURES_PER_MINUTE="7",
        NUM_PROXIES="1",
    )
    assert values == {
        "AXES_FAILURE_LIMIT": 3,
        "AXES_COOLOFF_TIME": "0:02:00",
        "API_TOKEN_FAILURES_PER_MINUTE": 7,
        "NUM_PROXIES": 1,
    }
    defaults = read_settings(tmp_path, ["AXES_FAILURE_LIMIT", "AXES_COOLOFF_TIME", "AUTHENTICATION_BACKENDS"])
    assert defaults["AXES_FAILURE_LIMIT"] == 5
    assert defaults["AXES_COOLOFF_TIME"] == "0:15:00"
    assert defaults["AUTHENTICATION_BACKENDS"][0] == "axes.backends.AxesStandaloneBackend"


@pytest.mark.parametrize(
    ("variable", "value"), [("LOGIN_FAILURE_LIMIT", "0"), ("LOGIN_LOCKOUT_MINUTES", "0"), ("NUM_PROXIES", "-1")]
)
def test_a_throttle_setting_that_would_lock_everyone_out_or_in_is_refused(tmp_path, variable, value):
    done = run(["manage.py", "check"], tmp_path, **{variable: value})
    assert done.returncode != 0
    assert variable in done.stderr
