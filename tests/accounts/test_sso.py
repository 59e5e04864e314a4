"""Institutional login (accounts/sso*.py). OpenID Connect runs the whole code flow against a small
provider served over real HTTP in this process (token and userinfo endpoints, HS256 id tokens).
There is no LDAP server here: the LDAP tests cover the settings wiring and django-auth-ldap's own
user population (attribute map and the unix username hook) with the directory entry given."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from django.conf import settings as django_settings
from django.test import Client
from django.urls import NoReverseMatch, reverse

from accounts.models import User
from tests.factories import UserFactory
from tests.test_settings import read_settings, run

pytest.importorskip("mozilla_django_oidc", reason="the sso extra is not installed: pip install '.[sso]'")
pytest.importorskip("django_auth_ldap", reason="the sso extra is not installed: pip install '.[sso]'")

jwt = pytest.importorskip("jwt")  # mozilla-django-oidc's own dependency

CLIENT_ID = "gpu-portal"
CLIENT_SECRET = "a-client-secret-long-enough-for-hs256-0123456789"
OIDC_BACKEND = "accounts.sso_oidc.PortalOIDCBackend"
AXES_BACKEND = "axes.backends.AxesStandaloneBackend"
MODEL_BACKEND = "django.contrib.auth.backends.ModelBackend"


class Provider:
    """An OpenID provider's token and userinfo endpoints; the test sets the next login's subject and
    claims (a "sub" among the claims makes the userinfo answer disagree with the ID token)."""

    def __init__(self) -> None:
        self.sub = "sub-1"
        self.userinfo_sub: str | None = None
        self.claims: dict[str, Any] = {}
        self.token_requests = 0
        self.nonce = ""
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                provider.token_requests += 1
                now = int(time.time())
                id_token = jwt.encode(
                    {"iss": provider.url, "aud": CLIENT_ID, "sub": provider.sub, "iat": now, "exp": now + 60}
                    | {"nonce": provider.nonce},
                    CLIENT_SECRET,
                    algorithm="HS256",
                )
                self.reply({"id_token": id_token, "access_token": "access-1", "token_type": "Bearer"})

            def do_GET(self) -> None:
                assert self.headers["Authorization"] == "Bearer access-1"
                self.reply({"sub": provider.userinfo_sub or provider.sub, **provider.claims})

            def reply(self, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture(scope="module")
def provider() -> Iterator[Provider]:
    op = Provider()
    yield op
    op.server.shutdown()


@pytest.fixture
def oidc(settings, provider) -> Provider:
    settings.AUTHENTICATION_BACKENDS = [AXES_BACKEND, MODEL_BACKEND, OIDC_BACKEND]
    settings.ROOT_URLCONF = "tests.accounts.sso_urls"
    settings.OIDC_ENABLED = True
    settings.OIDC_RP_CLIENT_ID = CLIENT_ID
    settings.OIDC_RP_CLIENT_SECRET = CLIENT_SECRET
    settings.OIDC_RP_SIGN_ALGO = "HS256"
    settings.OIDC_RP_SCOPES = "openid email profile"
    settings.OIDC_OP_AUTHORIZATION_ENDPOINT = f"{provider.url}/authorize"
    settings.OIDC_OP_TOKEN_ENDPOINT = f"{provider.url}/token"
    settings.OIDC_OP_USER_ENDPOINT = f"{provider.url}/userinfo"
    settings.OIDC_USE_PKCE = True
    settings.OIDC_STAFF_GROUPS = ["gpu-admins"]
    settings.LOGIN_REDIRECT_URL_FAILURE = "/accounts/login/"
    settings.UNIX_USERNAME_SOURCE = "directory"  # the default with a unix username claim named
    settings.OIDC_UNIX_USERNAME_CLAIM = "uid"
    return provider


def log_in(client, provider: Provider, sub: str = "sub-1", userinfo_sub: str | None = None, **claims: Any):
    """The browser's side of the code flow: the portal sends it to the provider, which sends it back
    with a code; the portal then asks the provider for the tokens and the claims of subject ``sub``
    (``userinfo_sub``: a userinfo answer about someone else)."""
    provider.sub, provider.userinfo_sub = sub, userinfo_sub
    provider.claims = claims
    start = client.get("/oidc/authenticate/")
    assert start.status_code == 302
    query = parse_qs(urlsplit(start["Location"]).query)
    assert query["client_id"] == [CLIENT_ID]
    assert query["code_challenge_method"] == ["S256"]
    provider.nonce = query["nonce"][0]
    return client.get("/oidc/callback/", {"code": "code-1", "state": query["state"][0]})


def logged_in_as(client) -> User | None:
    user_id = client.session.get("_auth_user_id")
    return User.objects.get(pk=user_id) if user_id else None


CLAIMS = {
    "preferred_username": "dana",
    "uid": "dana",
    "given_name": "Dana",
    "family_name": "Scully",
    "email": "dana@example.org",
    "email_verified": True,
    "groups": ["physics"],
}


def test_with_nothing_configured_only_local_accounts_log_in(client, db):
    assert django_settings.AUTHENTICATION_BACKENDS == [AXES_BACKEND, MODEL_BACKEND]
    assert django_settings.OIDC_ENABLED is False
    with pytest.raises(NoReverseMatch):
        reverse("oidc_authentication_init")
    page = client.get("/accounts/login/")
    assert b"Institutional login" not in page.content
    assert client.get("/oidc/authenticate/").status_code == 404


def test_the_login_page_offers_the_institutional_login(client, oidc):
    page = client.get("/accounts/login/?next=/status/")
    assert b'href="/oidc/authenticate/?next=/status/">Institutional login</a>' in page.content


def test_a_first_login_creates_the_user_from_the_claims(client, oidc, db):
    done = log_in(client, oidc, **CLAIMS)
    assert done.status_code == 302
    assert done["Location"] == reverse("calendar")
    dana = logged_in_as(client)
    assert dana is not None
    assert (dana.username, dana.unix_username, dana.first_name, dana.last_name, dana.email) == (
        "dana",
        "dana",
        "Dana",
        "Scully",
        "dana@example.org",
    )
    assert not dana.has_usable_password()
    assert dana.is_staff is False
    assert dana.oidc_sub == "sub-1"  # later logins find the account by it


def test_the_next_login_updates_the_user(client, oidc, db):
    log_in(client, oidc, **CLAIMS)
    client.logout()
    log_in(client, oidc, **(CLAIMS | {"family_name": "Mulder", "groups": ["physics", "gpu-admins"]}))
    dana = logged_in_as(client)
    assert dana.last_name == "Mulder"
    assert dana.is_staff is True  # a member of OIDC_STAFF_GROUPS
    assert User.objects.filter(username="dana").count() == 1


@pytest.mark.parametrize(
    ("unix_username", "reason"),
    [
        ("root", "is a system or service account"),
        ("../x", "is not a valid unix username"),
        ("Dana", "is not a valid unix username"),
        ("dana\n", "is not a valid unix username"),
    ],
)
def test_a_hostile_unix_username_refuses_the_login_and_says_why(client, oidc, settings, db, unix_username, reason):
    settings.OIDC_UNIX_USERNAME_CLAIM = "uid"
    done = log_in(client, oidc, **(CLAIMS | {"uid": unix_username}))
    assert done["Location"] == "/accounts/login/"
    assert logged_in_as(client) is None
    assert not User.objects.exists()
    page = client.get("/accounts/login/")
    assert "Institutional login refused" in page.content.decode()
    assert reason in page.content.decode()


def test_a_portal_username_django_refuses_refuses_the_login(client, oidc, db):
    log_in(client, oidc, **(CLAIMS | {"preferred_username": "../x"}))
    assert not User.objects.exists()
    assert "Enter a valid username." in client.get("/accounts/login/").content.decode()


def test_a_unix_username_claim_can_differ_from_the_portal_username(client, oidc, settings, db):
    settings.OIDC_UNIX_USERNAME_CLAIM = "uid"
    log_in(client, oidc, **(CLAIMS | {"preferred_username": "dana.scully@example.org", "uid": "dscully"}))
    user = logged_in_as(client)
    assert (user.username, user.unix_username) == ("dana.scully@example.org", "dscully")


def test_a_unix_username_held_by_another_account_refuses_the_login(client, oidc, db):
    UserFactory(username="someone", unix_username="dana")
    log_in(client, oidc, **CLAIMS)
    assert logged_in_as(client) is None
    assert "already the unix username of another portal account" in client.get("/accounts/login/").content.decode()


def test_an_unverified_email_never_matches_an_account(client, oidc, db):
    bob = UserFactory(username="bob", email="bob@example.org")
    claims = CLAIMS | {"preferred_username": "mallory", "email": "bob@example.org", "email_verified": False}
    log_in(client, oidc, **claims)
    mallory = logged_in_as(client)
    assert mallory.pk != bob.pk
    assert mallory.username == "mallory"
    assert mallory.email == ""  # not stored either


def test_a_verified_email_never_links_an_existing_account(client, oidc, settings, db):
    settings.OIDC_UNIX_USERNAME_CLAIM = "uid"
    bob = UserFactory(username="bob", email="Bob@example.org", unix_username="bob")
    log_in(client, oidc, sub="sub-mallory", **(CLAIMS | {"preferred_username": "mallory", "email": "bob@example.org"}))
    mallory = logged_in_as(client)
    assert mallory.pk != bob.pk
    assert mallory.username == "mallory"


def refusal_on_the_login_page(client) -> str:
    return client.get("/accounts/login/").content.decode()


def test_a_renamed_username_or_email_at_the_provider_lands_on_the_same_account(client, oidc, settings, db):
    settings.OIDC_UNIX_USERNAME_CLAIM = "uid"
    log_in(client, oidc, **(CLAIMS | {"uid": "dana"}))
    dana = logged_in_as(client)
    client.logout()

    log_in(client, oidc, **(CLAIMS | {"uid": "dana", "preferred_username": "dana.scully", "email": "ds@example.org"}))

    assert logged_in_as(client).pk == dana.pk
    dana.refresh_from_db()
    assert (dana.username, dana.unix_username, dana.email) == ("dana", "dana", "ds@example.org")
    assert not User.objects.filter(username="dana.scully").exists()


def test_another_subject_claiming_a_linked_username_is_refused(client, oidc, db):
    log_in(client, oidc, **CLAIMS)
    client.logout()

    done = log_in(client, oidc, sub="sub-mallory", **CLAIMS)

    assert done["Location"] == "/accounts/login/"
    assert logged_in_as(client) is None
    assert User.objects.get(username="dana").oidc_sub == "sub-1"
    page = refusal_on_the_login_page(client)
    assert "Institutional login refused for &#x27;dana&#x27;" in page
    assert "Ask an administrator to link it" in page


@pytest.mark.parametrize("flags", [{"is_staff": True}, {"is_superuser": True}], ids=["staff", "superuser"])
def test_a_new_subject_claiming_a_staff_accounts_username_is_refused(client, oidc, db, flags):
    # Even a staff account an earlier institutional login made (no password) is linked only by an admin.
    admin = UserFactory(username="carol", **flags)
    admin.set_unusable_password()
    admin.save()

    done = log_in(client, oidc, sub="sub-eve", **(CLAIMS | {"preferred_username": "carol", "groups": ["gpu-admins"]}))

    assert done["Location"] == "/accounts/login/"
    assert logged_in_as(client) is None
    assert list(User.objects.values_list("username", "oidc_sub")) == [("carol", None)]
    page = refusal_on_the_login_page(client)
    assert "the portal account &#x27;carol&#x27; is not linked to your institutional identity" in page
    assert "set the account&#x27;s OpenID Connect subject to &#x27;sub-eve&#x27;" in page


def test_a_local_account_with_a_password_is_never_linked_by_its_username(client, oidc, db):
    bob = UserFactory(username="bob")
    log_in(client, oidc, sub="sub-someone", **(CLAIMS | {"preferred_username": "bob"}))
    assert logged_in_as(client) is None
    bob.refresh_from_db()
    assert bob.oidc_sub is None
    assert "not linked to your institutional identity" in refusal_on_the_login_page(client)


def test_a_password_less_account_is_not_linked_by_its_username_by_default(client, oidc, db):
    """An LDAP account, or one an admin made password-less, looks just like one an old login made:
    a username claim someone can edit must not hand it over."""
    dana = UserFactory(username="dana")
    dana.set_unusable_password()
    dana.save()

    log_in(client, oidc, sub="sub-attacker", **CLAIMS)

    assert logged_in_as(client) is None
    dana.refresh_from_db()
    assert dana.oidc_sub is None
    assert "not linked to your institutional identity" in refusal_on_the_login_page(client)


def test_while_upgrading_an_account_an_earlier_institutional_login_made_is_linked_once_and_then_only_to_it(
    client, oidc, db, settings
):
    settings.OIDC_LINK_BY_USERNAME = True
    dana = UserFactory(username="dana")  # made before subjects were stored: no password, no subject
    dana.set_unusable_password()
    dana.save()
    inactive = UserFactory(username="erin", is_active=False)
    inactive.set_unusable_password()
    inactive.save()
    log_in(client, oidc, sub="sub-erin", **(CLAIMS | {"preferred_username": "erin", "uid": "erin"}))
    assert logged_in_as(client) is None  # an inactive account is never linked
    inactive.refresh_from_db()
    assert inactive.oidc_sub is None

    log_in(client, oidc, sub="sub-dana", **CLAIMS)
    assert logged_in_as(client).pk == dana.pk
    dana.refresh_from_db()
    assert dana.oidc_sub == "sub-dana"
    client.logout()

    log_in(client, oidc, sub="sub-other", **CLAIMS)
    assert logged_in_as(client) is None


def test_an_admin_links_a_staff_account_in_django_admin_and_it_then_logs_in(client, oidc, db):
    carol = UserFactory(username="carol", is_staff=True, is_superuser=True)
    admin = Client()
    admin.force_login(carol)
    url = f"/admin/accounts/user/{carol.pk}/change/"
    page = admin.get(url).content.decode()
    assert "OpenID Connect subject" in page
    assert "never by username or email" in page  # the help text says what the field does

    form = {
        "username": "carol",
        "email": carol.email,
        "is_active": "on",
        "is_staff": "on",
        "is_superuser": "on",
        "date_joined_0": "2030-01-01",
        "date_joined_1": "09:00:00",
        "oidc_sub": "sub-carol",
    }
    saved = admin.post(url, form)
    assert saved.status_code == 302, saved.content.decode()[:2000]
    carol.refresh_from_db()
    assert carol.oidc_sub == "sub-carol"

    log_in(client, oidc, sub="sub-carol", **(CLAIMS | {"preferred_username": "carol-idp", "groups": ["gpu-admins"]}))
    assert logged_in_as(client).pk == carol.pk
    carol.refresh_from_db()
    assert carol.is_staff and carol.is_superuser and carol.username == "carol"


def test_a_userinfo_answer_about_another_subject_refuses_the_login(client, oidc, db):
    log_in(client, oidc, sub="sub-1", userinfo_sub="sub-2", **CLAIMS)
    assert logged_in_as(client) is None
    assert not User.objects.exists()
    assert "answers were about two people" in refusal_on_the_login_page(client)


def test_an_address_locked_out_by_failed_passwords_is_refused_before_the_provider_is_asked(client, oidc, db):
    for attempt in range(5):
        client.post("/accounts/login/", {"username": f"guess-{attempt}", "password": "wrong"})
    asked = oidc.token_requests

    done = log_in(client, oidc, **CLAIMS)

    assert done.status_code == 429
    assert "Too many failed logins" in done.content.decode()
    assert int(done["Retry-After"]) > 0
    assert oidc.token_requests == asked
    assert logged_in_as(client) is None


# Settings wiring, read by a fresh interpreter as a deployment would.

OIDC_ENV = {
    "OIDC_RP_CLIENT_ID": CLIENT_ID,
    "OIDC_RP_CLIENT_SECRET": CLIENT_SECRET,
    "OIDC_OP_AUTHORIZATION_ENDPOINT": "https://id.example.org/auth",
    "OIDC_OP_TOKEN_ENDPOINT": "https://id.example.org/token",
    "OIDC_OP_USER_ENDPOINT": "https://id.example.org/userinfo",
    "OIDC_OP_JWKS_ENDPOINT": "https://id.example.org/certs",
    "OIDC_STAFF_GROUPS": "gpu-admins,hpc-staff",
}


def test_the_oidc_environment_adds_the_backend_and_the_urls(tmp_path):
    code = (
        "import django; django.setup(); from django.conf import settings; from django.urls import reverse; "
        "from django.test import Client; "
        "print(settings.AUTHENTICATION_BACKENDS, reverse('oidc_authentication_callback'), settings.OIDC_USE_PKCE); "
        "print(Client().get('/accounts/login/').content.decode())"
    )
    label = "Log in with your university account"
    done = run(["-c", code], tmp_path, **OIDC_ENV, OIDC_LOGIN_LABEL=label, ALLOWED_HOSTS="testserver")
    assert done.returncode == 0, done.stderr
    assert f"['{AXES_BACKEND}', '{MODEL_BACKEND}', '{OIDC_BACKEND}'] /oidc/callback/ True" in done.stdout
    assert "Log in with your university account</a>" in done.stdout
    values = read_settings(tmp_path, ["OIDC_RP_SIGN_ALGO", "OIDC_STAFF_GROUPS"], **OIDC_ENV)
    assert values == {"OIDC_RP_SIGN_ALGO": "RS256", "OIDC_STAFF_GROUPS": ["gpu-admins", "hpc-staff"]}


def test_an_incomplete_oidc_environment_says_what_is_missing(tmp_path):
    env = {k: v for k, v in OIDC_ENV.items() if k not in {"OIDC_OP_TOKEN_ENDPOINT", "OIDC_OP_JWKS_ENDPOINT"}}
    done = run(["manage.py", "check"], tmp_path, **env)
    assert done.returncode != 0
    assert "Institutional login needs OIDC_OP_TOKEN_ENDPOINT as well." in done.stderr


LDAP_ENV = {
    "LDAP_SERVER_URI": "ldaps://ldap.example.org",
    "LDAP_BIND_DN": "cn=portal,ou=services,dc=example,dc=org",
    "LDAP_BIND_PASSWORD": "bind-secret",
    "LDAP_USER_SEARCH_BASE": "ou=people,dc=example,dc=org",
    "LDAP_STAFF_GROUP": "cn=gpu-admins,ou=groups,dc=example,dc=org",
    "LDAP_GROUP_TYPE": "posixGroup",
    "LDAP_GROUP_SEARCH_FILTER": "(objectClass=posixGroup)",
}


def test_the_ldap_environment_configures_django_auth_ldap(tmp_path):
    code = (
        "import django; django.setup(); from django.conf import settings as s; "
        "print(s.AUTHENTICATION_BACKENDS, s.AUTH_LDAP_SERVER_URI, s.AUTH_LDAP_BIND_DN, s.AUTH_LDAP_BIND_PASSWORD); "
        "print(s.AUTH_LDAP_USER_SEARCH.base_dn, s.AUTH_LDAP_USER_SEARCH.filterstr, s.AUTH_LDAP_USER_ATTR_MAP); "
        "print(type(s.AUTH_LDAP_GROUP_TYPE).__name__, s.AUTH_LDAP_GROUP_SEARCH.filterstr, "
        "s.AUTH_LDAP_USER_FLAGS_BY_GROUP)"
    )
    done = run(["-c", code], tmp_path, **LDAP_ENV)
    assert done.returncode == 0, done.stderr
    backends, search, groups = done.stdout.splitlines()[-3:]
    assert backends == (
        f"['{AXES_BACKEND}', 'accounts.sso_ldap.PortalLDAPBackend', '{MODEL_BACKEND}', "
        "'accounts.sso_ldap.DirectoryAwayBackend'] "
        "ldaps://ldap.example.org cn=portal,ou=services,dc=example,dc=org bind-secret"
    )
    assert search == (
        "ou=people,dc=example,dc=org (uid=%(user)s) {'first_name': 'givenName', 'last_name': 'sn', 'email': 'mail'}"
    )
    assert groups == (
        "PosixGroupType (objectClass=posixGroup) {'is_staff': 'cn=gpu-admins,ou=groups,dc=example,dc=org'}"
    )


def test_an_ldap_environment_without_a_search_base_is_refused(tmp_path):
    env = {k: v for k, v in LDAP_ENV.items() if k != "LDAP_USER_SEARCH_BASE"}
    done = run(["manage.py", "check"], tmp_path, **env)
    assert "Institutional login needs LDAP_USER_SEARCH_BASE as well." in done.stderr


def ldap_user_from(entry: dict[str, list[str]], username: str = "dana"):
    """django-auth-ldap's user for a directory entry that was already read (no server here)."""
    from django_auth_ldap.backend import _LDAPUser

    from accounts.sso_ldap import PortalLDAPBackend

    ldap_user = _LDAPUser(PortalLDAPBackend(), username=username)
    ldap_user._user_dn = f"uid={username},ou=people,dc=example,dc=org"
    ldap_user._user_attrs = entry
    return ldap_user


@pytest.fixture
def ldap_settings(settings):
    settings.AUTH_LDAP_USER_ATTR_MAP = {"first_name": "givenName", "last_name": "sn", "email": "mail"}
    settings.LDAP_UNIX_USERNAME_ATTR = "uid"
    settings.UNIX_USERNAME_SOURCE = "directory"  # the default with institutional login configured


def test_an_ldap_login_populates_the_user_and_its_unix_username(db, ldap_settings):
    entry = {"uid": ["dscully"], "givenName": ["Dana"], "sn": ["Scully"], "mail": ["dana@example.org"]}
    ldap_user = ldap_user_from(entry)
    ldap_user._get_or_create_user(force_populate=True)
    dana = User.objects.get(username="dana")
    assert (dana.unix_username, dana.first_name, dana.email) == ("dscully", "Dana", "dana@example.org")
    assert not dana.has_usable_password()


@pytest.mark.parametrize("uid", ["root", "../x"])
def test_an_ldap_entry_with_a_hostile_unix_username_is_refused(db, ldap_settings, uid, caplog):
    ldap_user = ldap_user_from({"uid": [uid], "givenName": ["Eve"], "sn": ["X"], "mail": ["eve@example.org"]}, "eve")
    with pytest.raises(ldap_user.AuthenticationFailed, match="Institutional login refused for 'eve'"):
        ldap_user._get_or_create_user(force_populate=True)
    assert "Institutional login refused for 'eve'" in caplog.text


def test_without_a_unix_username_claim_a_renamed_username_claim_opens_nothing(client, oidc, db, settings):
    """preferred_username is editable at some providers: it never names the node account."""
    settings.OIDC_UNIX_USERNAME_CLAIM = ""
    log_in(client, oidc, **{**CLAIMS, "preferred_username": "bob", "uid": "bob"})

    assert logged_in_as(client).unix_username is None


def test_with_the_provider_away_the_login_says_so_and_local_accounts_still_log_in(client, oidc, settings, db):
    """The OpenID provider stopped (docs/operations.md, "When a dependency is away") after it sent the browser back
    with a code: the portal cannot exchange it, says so on the login page and logs nobody in; a local account logs
    in with its password as ever."""
    away = Provider()
    settings.OIDC_OP_TOKEN_ENDPOINT = f"{away.url}/token"
    settings.OIDC_OP_USER_ENDPOINT = f"{away.url}/userinfo"
    away.server.shutdown()
    away.server.server_close()  # nothing listens there now
    admin = UserFactory(username="root-admin", is_staff=True)
    admin.set_password("local-admin-password")
    admin.save()

    for _ in range(settings.LOGIN_FAILURE_LIMIT + 1):
        done = log_in(client, away, **CLAIMS)
        assert done.status_code == 302 and done["Location"] == "/accounts/login/"
        page = client.get("/accounts/login/")
        assert "The institutional login cannot reach its provider just now" in page.content.decode()
    assert away.token_requests == 0 and logged_in_as(client) is None
    # No failure was counted against the address: the local admin, from the same address, logs in.
    local = client.post("/accounts/login/", {"username": "root-admin", "password": "local-admin-password"})
    assert local.status_code == 302 and logged_in_as(client) == admin
