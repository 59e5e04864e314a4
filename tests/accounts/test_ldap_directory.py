"""LDAP login against a real directory (slapd, tests/accounts/directory.py), through the login form:
failed logins count, and once locked out the portal stops relaying passwords to the directory."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.test import Client

from accounts.models import User
from tests.accounts.directory import ADMIN_DN, ADMIN_PASSWORD, PEOPLE, SUFFIX, Directory, available
from tests.factories import UserFactory

pytest.importorskip("django_auth_ldap", reason="the sso extra is not installed: pip install '.[sso]'")
pytestmark = pytest.mark.skipif(not available(), reason="slapd is not installed (scripts/services installs it)")

DANA_PASSWORD = "dana-directory-password"
ERIN_PASSWORD = "erin-directory-password"
# As portal/settings.py lists them when LDAP_SERVER_URI is set.
BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "accounts.sso_ldap.PortalLDAPBackend",
    "django.contrib.auth.backends.ModelBackend",
    "accounts.sso_ldap.DirectoryAwayBackend",
]


@pytest.fixture(scope="module")
def directory() -> Iterator[Directory]:
    server = Directory()
    server.start()
    server.dana = server.add_person("dana", DANA_PASSWORD, given="Dana", surname="Scully")
    yield server
    server.stop()


@pytest.fixture
def ldap_login(settings, directory: Directory) -> Directory:
    """The settings LDAP_SERVER_URI and friends produce (portal/settings.py), aimed at the directory."""
    import ldap
    from django_auth_ldap.config import LDAPSearch

    settings.AUTH_LDAP_SERVER_URI = directory.uri
    settings.AUTH_LDAP_BIND_DN = ADMIN_DN
    settings.AUTH_LDAP_BIND_PASSWORD = ADMIN_PASSWORD
    settings.AUTH_LDAP_USER_SEARCH = LDAPSearch(PEOPLE, ldap.SCOPE_SUBTREE, "(uid=%(user)s)")
    settings.AUTH_LDAP_USER_ATTR_MAP = {"first_name": "givenName", "last_name": "sn", "email": "mail"}
    settings.LDAP_UNIX_USERNAME_ATTR = "uid"
    settings.UNIX_USERNAME_SOURCE = "directory"
    settings.AUTHENTICATION_BACKENDS = BACKENDS
    return directory


def log_in(client: Client, username: str, password: str):
    return client.post("/accounts/login/", {"username": username, "password": password})


def test_a_directory_account_logs_in_through_the_login_form(client, ldap_login, db):
    done = log_in(client, "dana", DANA_PASSWORD)
    assert done.status_code == 302
    dana = User.objects.get(username="dana")
    assert (dana.unix_username, dana.first_name, dana.email) == ("dana", "Dana", "dana@example.org")
    assert client.session["_auth_user_id"] == str(dana.pk)


def test_failed_directory_logins_lock_out_before_more_passwords_reach_the_directory(clock, client, ldap_login, db):
    ldap_login.settle()
    before = ldap_login.binds_as(ldap_login.dana)

    # The directory matches uid without regard to case; so does the count.
    for name in ("dana", "Dana", "DANA", "dana", "dAnA"):
        last = log_in(client, name, "a guess")
    ldap_login.settle()
    assert ldap_login.binds_as(ldap_login.dana) == before + 5  # each wrong password was checked there
    assert last.status_code == 429

    for _ in range(3):
        refused = log_in(client, "dana", DANA_PASSWORD)
        assert refused.status_code == 429
        assert "Too many failed logins" in refused.content.decode()
    ldap_login.settle()

    assert ldap_login.binds_as(ldap_login.dana) == before + 5  # nothing more was relayed
    assert "_auth_user_id" not in client.session


def test_spraying_many_usernames_from_one_address_locks_the_address_before_the_directory(clock, ldap_login, db):
    sprayer = Client(REMOTE_ADDR="198.51.100.66")
    for name in ("alice", "bob", "carol", "dave", "erin"):
        log_in(sprayer, name, "Winter2030!")
    ldap_login.settle()
    before = ldap_login.binds_as(ldap_login.dana)

    refused = log_in(sprayer, "dana", DANA_PASSWORD)

    assert refused.status_code == 429
    ldap_login.settle()
    assert ldap_login.binds_as(ldap_login.dana) == before
    assert log_in(Client(REMOTE_ADDR="198.51.100.67"), "dana", DANA_PASSWORD).status_code == 302


@pytest.fixture
def active_group(ldap_login, settings, directory):
    """LDAP_ACTIVE_GROUP as portal/settings.py wires it: only dana's colleague erin is a member."""
    import ldap
    from django_auth_ldap.config import GroupOfNamesType, LDAPSearch

    if not hasattr(directory, "erin"):
        directory.erin = directory.add_person("erin", ERIN_PASSWORD, given="Erin", surname="Ward")
        directory.gpu_users = directory.add_group("gpu-users", [directory.erin])
    settings.AUTH_LDAP_GROUP_SEARCH = LDAPSearch(SUFFIX, ldap.SCOPE_SUBTREE, "(objectClass=groupOfNames)")
    settings.AUTH_LDAP_GROUP_TYPE = GroupOfNamesType()
    settings.AUTH_LDAP_USER_FLAGS_BY_GROUP = {"is_active": directory.gpu_users}
    return directory


def test_a_login_outside_the_active_group_deactivates_and_ends_the_bookings(
    clock, client, active_group, gpus, django_capture_on_commit_callbacks
):
    from reservations.models import Reservation
    from reservations.services import reservation_create
    from tests.conftest import at

    dana = UserFactory(username="dana", unix_username="dana")
    booking = reservation_create(user=dana, gpus=gpus[:1], start=at(1), end=at(2))

    with django_capture_on_commit_callbacks(execute=True):
        refused = log_in(client, "dana", DANA_PASSWORD)

    assert refused.status_code == 200 and "_auth_user_id" not in client.session
    dana.refresh_from_db()
    booking.refresh_from_db()
    assert not dana.is_active
    assert (booking.status, booking.cancel_reason) == (Reservation.Status.CANCELLED, "the account was deactivated")


def test_the_directory_never_reactivates_someone_an_admin_deactivated(client, active_group, db):
    UserFactory(username="erin", unix_username="erin", is_active=False)  # deactivated in the portal

    refused = log_in(client, "erin", ERIN_PASSWORD)

    assert refused.status_code == 200 and "_auth_user_id" not in client.session
    assert not User.objects.get(username="erin").is_active
    assert log_in(Client(), "erin", ERIN_PASSWORD).status_code == 200  # still in the group, still out
    assert User.objects.filter(username="erin", is_active=False).exists()


def test_a_member_of_the_active_group_logs_in(client, active_group, db):
    assert log_in(client, "erin", ERIN_PASSWORD).status_code == 302
    assert User.objects.get(username="erin").is_active


@pytest.fixture
def directory_to_stop(settings, db) -> Iterator[Directory]:
    """A directory of its own with dana in it, the portal logging in through it, and a local admin (root-admin,
    local-admin-password) beside it; the test stops it when it likes, and it is stopped in any case."""
    import ldap
    from django_auth_ldap.config import LDAPSearch

    away = Directory()
    away.start()
    try:
        away.add_person("dana", DANA_PASSWORD, given="Dana", surname="Scully")
        settings.AUTH_LDAP_SERVER_URI = away.uri
        settings.AUTH_LDAP_BIND_DN, settings.AUTH_LDAP_BIND_PASSWORD = ADMIN_DN, ADMIN_PASSWORD
        settings.AUTH_LDAP_USER_SEARCH = LDAPSearch(PEOPLE, ldap.SCOPE_SUBTREE, "(uid=%(user)s)")
        settings.AUTHENTICATION_BACKENDS = BACKENDS
        admin = UserFactory(username="root-admin", is_staff=True)
        admin.set_password("local-admin-password")
        admin.save()
        yield away
    finally:
        away.stop()


def test_with_the_directory_away_a_login_says_so_counts_no_failure_and_local_accounts_still_log_in(
    directory_to_stop, settings, client
):
    """The directory stopped (docs/operations.md, "When a dependency is away"): its people are told the directory
    cannot be reached, not that their password is wrong, and no lockout counts against them; a local account
    (an admin's) logs in as ever."""
    assert log_in(client, "dana", DANA_PASSWORD).status_code == 302
    client.logout()
    directory_to_stop.stop()

    for _ in range(settings.LOGIN_FAILURE_LIMIT + 1):
        refused = log_in(client, "dana", DANA_PASSWORD)
        assert refused.status_code == 503 and refused["Retry-After"] == "60"
        assert "The directory that checks passwords cannot be reached just now" in refused.content.decode()
        assert "do not match" not in refused.content.decode()
    assert "_auth_user_id" not in client.session
    # Nothing was counted against dana or the address: the local admin, from the same address, logs in.
    assert log_in(client, "root-admin", "local-admin-password").status_code == 302


def test_with_the_directory_away_the_admin_login_says_so_too(directory_to_stop, client):
    """Review of issue 37: Django admin's own login form let DirectoryUnreachable through, a 500. It now says what
    the portal's login page says, with the same 503, and its staff check stays."""
    admin_login = "/admin/login/?next=/admin/"
    # dana is in the directory but no staff: admin refuses her while the directory answers.
    refused = client.post(admin_login, {"username": "dana", "password": DANA_PASSWORD})
    assert refused.status_code == 200 and "staff account" in refused.content.decode()
    client.logout()
    directory_to_stop.stop()

    refused = client.post(admin_login, {"username": "dana", "password": DANA_PASSWORD})
    assert refused.status_code == 503 and refused["Retry-After"] == "60"
    assert "The directory that checks passwords cannot be reached just now" in refused.content.decode()
    assert "_auth_user_id" not in client.session
    # A local admin logs in to admin as ever.
    done = client.post(admin_login, {"username": "root-admin", "password": "local-admin-password"})
    assert done.status_code == 302 and done["Location"] == "/admin/"
