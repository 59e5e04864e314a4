"""The profile page: settings (unix username request, time zone, reminders) and API tokens."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from rest_framework.test import APIClient

from accounts.models import ApiToken
from accounts.services import api_token_create, hash_token
from audit.models import AuditEntry
from tests.factories import UserFactory

PROFILE = reverse("profile")
TOKEN_CREATE = reverse("token-create")
TOKEN_RE = re.compile(r"gpb_[A-Za-z0-9_-]{20,}")


def logged_in(user, **client_options) -> Client:
    client = Client(**client_options)
    client.force_login(user)
    return client


def flashed(response) -> list[str]:
    return [str(message) for message in response.context["messages"]]


def settings_post(**fields) -> dict:
    return {"timezone": "UTC", "remind_before_end_minutes": "15", **fields}


def get_me(token: str):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client.get("/api/v1/me/")


@pytest.fixture
def newcomer(db):
    return UserFactory(username="dana", unix_username=None)


# --- who may do what -------------------------------------------------------------------------


def test_anonymous_visitors_are_sent_to_log_in(client, alice):
    token, _ = api_token_create(user=alice, name="laptop")
    login = reverse("login")
    assert client.get(PROFILE).url == f"{login}?next={PROFILE}"
    assert client.post(PROFILE, settings_post()).url.startswith(login)
    assert client.post(TOKEN_CREATE, {"name": "x"}).url.startswith(login)
    assert client.post(reverse("token-revoke", args=[token.pk])).url.startswith(login)
    assert ApiToken.objects.count() == 1
    token.refresh_from_db()
    assert token.revoked_at is None


def test_the_profile_page_shows_the_settings(alice):
    alice.timezone = "Europe/Berlin"
    alice.save()
    response = logged_in(alice).get(PROFILE)
    assert response.status_code == 200
    assert response.context["nav"] == "profile"
    html = response.content.decode()
    assert '<option value="Europe/Berlin" selected>' in html
    assert '<option value="America/New_York">' in html
    assert 'name="unix_username_requested" value="alice"' in html
    assert "Confirmed: your GPUs open for <strong>alice</strong>." in html


def test_token_actions_take_post_only(alice):
    token, _ = api_token_create(user=alice, name="laptop")
    client = logged_in(alice)
    assert client.get(TOKEN_CREATE).status_code == 405
    assert client.get(reverse("token-revoke", args=[token.pk])).status_code == 405


@pytest.mark.parametrize(
    ("url", "data"), [(PROFILE, settings_post(timezone="Asia/Tokyo")), (TOKEN_CREATE, {"name": "x"})]
)
def test_forms_need_the_csrf_token(alice, url, data):
    response = logged_in(alice, enforce_csrf_checks=True).post(url, data)
    assert response.status_code == 403
    alice.refresh_from_db()
    assert alice.timezone == "UTC"
    assert not ApiToken.objects.exists()


def test_revoke_needs_the_csrf_token(alice):
    token, _ = api_token_create(user=alice, name="laptop")
    response = logged_in(alice, enforce_csrf_checks=True).post(reverse("token-revoke", args=[token.pk]))
    assert response.status_code == 403
    token.refresh_from_db()
    assert token.revoked_at is None


# --- settings --------------------------------------------------------------------------------


def test_a_newcomer_requests_a_unix_username_and_nothing_is_granted_until_an_admin_confirms(newcomer):
    client = logged_in(newcomer)
    html = client.get(PROFILE).content.decode()
    assert 'name="unix_username_requested" value=""' in html
    assert "None yet: request one" in html

    response = client.post(PROFILE, settings_post(unix_username_requested="dana_lab"), follow=True)
    assert flashed(response) == [
        "Profile saved: unix username dana_lab requested: an admin confirms it before any GPU opens for it."
    ]
    newcomer.refresh_from_db()
    assert (newcomer.unix_username, newcomer.unix_username_requested) == (None, "dana_lab")
    entry = AuditEntry.objects.get(action="user.unix_username.request")
    assert (entry.before, entry.after) == ({"unix_username_requested": ""}, {"unix_username_requested": "dana_lab"})
    assert "<strong>dana_lab</strong> waits for an admin's confirmation" in response.content.decode()

    response = client.post(PROFILE, settings_post(unix_username_requested="dana_gpu"), follow=True)  # changed mind
    newcomer.refresh_from_db()
    assert (newcomer.unix_username, newcomer.unix_username_requested) == (None, "dana_gpu")

    client.post(PROFILE, settings_post(unix_username_requested=""), follow=True)
    newcomer.refresh_from_db()
    assert newcomer.unix_username_requested == ""
    assert AuditEntry.objects.filter(action="user.unix_username.withdraw").count() == 1


@pytest.mark.parametrize(
    ("name", "error"),
    [
        ("Dana", "&#x27;Dana&#x27; is not a valid unix username"),
        ("da na", "&#x27;da na&#x27; is not a valid unix username"),
        ("root", "&#x27;root&#x27; is a system or service account"),
        ("www-data", "&#x27;www-data&#x27; is a system or service account"),
        (
            "alice",
            "&#x27;alice&#x27; is already the unix username of another portal account. If it is yours, ask an admin.",
        ),
    ],
)
def test_a_bad_or_taken_unix_username_is_refused_next_to_the_field(newcomer, alice, name, error):
    response = logged_in(newcomer).post(PROFILE, settings_post(unix_username_requested=name, timezone="Asia/Tokyo"))
    assert response.status_code == 200
    html = response.content.decode()
    assert error in html
    assert 'aria-invalid="true"' in html
    newcomer.refresh_from_db()
    assert (newcomer.unix_username, newcomer.unix_username_requested, newcomer.timezone) == (None, "", "UTC")


@pytest.mark.parametrize(
    ("source", "sentence"),
    [
        ("admin", "Only an admin of the portal sets it: ask one."),
        ("directory", "It comes from the institutional directory when you log in"),
    ],
)
def test_where_admins_or_the_directory_set_it_a_researcher_cannot_ask(newcomer, settings, source, sentence):
    settings.UNIX_USERNAME_SOURCE = source
    client = logged_in(newcomer)
    html = client.get(PROFILE).content.decode()
    assert "unix_username_requested" not in html
    assert sentence in html

    client.post(PROFILE, settings_post(unix_username_requested="dana_lab", timezone="Asia/Tokyo"))

    newcomer.refresh_from_db()
    assert (newcomer.unix_username, newcomer.unix_username_requested, newcomer.timezone) == (None, "", "Asia/Tokyo")


def test_the_time_zone_and_reminder_are_saved(alice):
    response = logged_in(alice).post(
        PROFILE, settings_post(timezone="America/New_York", remind_before_end_minutes="30"), follow=True
    )
    assert response.redirect_chain == [(PROFILE, 302)]
    assert flashed(response) == ["Profile saved: time zone America/New_York, reminder 30."]
    alice.refresh_from_db()
    assert (alice.timezone, alice.remind_before_end_minutes, alice.unix_username) == ("America/New_York", 30, "alice")
    assert '<option value="America/New_York" selected>' in response.content.decode()


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"timezone": "Mars/Olympus_Mons"}, "Unknown time zone &#x27;Mars/Olympus_Mons&#x27;"),
        ({"timezone": ""}, "This field is required."),
        ({"remind_before_end_minutes": "241"}, "Ensure this value is less than or equal to 240."),
        ({"remind_before_end_minutes": "-1"}, "Ensure this value is greater than or equal to 0."),
    ],
)
def test_bad_settings_are_refused(alice, fields, error):
    response = logged_in(alice).post(PROFILE, settings_post(**fields))
    assert response.status_code == 200
    assert error in response.content.decode()
    alice.refresh_from_db()
    assert (alice.timezone, alice.remind_before_end_minutes) == ("UTC", 15)


# --- API tokens ------------------------------------------------------------------------------


def test_a_new_token_is_shown_once_and_works(alice):
    client = logged_in(alice)
    response = client.post(TOKEN_CREATE, {"name": "laptop", "expires_in_days": "30"})
    assert response.status_code == 200
    assert "no-store" in response["Cache-Control"]
    html = response.content.decode()
    token = TOKEN_RE.search(html).group()
    assert f'curl -H "Authorization: Bearer {token}" http://testserver/api/v1/me/' in html
    assert "shown only this once" in html

    record = ApiToken.objects.get(user=alice)
    assert (record.name, record.key_hash, record.prefix) == ("laptop", hash_token(token), token[:12])
    assert token not in str(list(ApiToken.objects.values_list()))
    assert record.expires_at is not None

    again = client.get(PROFILE)
    assert token not in again.content.decode()
    assert f"{record.prefix}…" in again.content.decode()
    assert token not in str(dict(client.session))

    assert get_me(token).json()["username"] == "alice"


def test_a_revoked_token_is_refused_afterwards(alice):
    client = logged_in(alice)
    token = TOKEN_RE.search(client.post(TOKEN_CREATE, {"name": "ci"}).content.decode()).group()
    record = ApiToken.objects.get(user=alice)
    assert record.expires_at is None
    assert get_me(token).status_code == 200

    response = client.post(reverse("token-revoke", args=[record.pk]), follow=True)
    assert flashed(response) == [f"Token “ci” ({record.prefix}…) revoked; requests that use it now fail."]
    assert ">revoked</span>" in response.content.decode()
    assert get_me(token).status_code == 401


@pytest.mark.parametrize(
    ("data", "error"),
    [
        ({"name": ""}, "This field is required."),
        ({"name": "x", "expires_in_days": "0"}, "Ensure this value is greater than or equal to 1."),
        ({"name": "x", "expires_in_days": "soon"}, "Enter a whole number."),
    ],
)
def test_a_bad_token_form_creates_nothing(alice, data, error):
    response = logged_in(alice).post(TOKEN_CREATE, data)
    assert response.status_code == 200
    assert error in response.content.decode()
    assert not TOKEN_RE.search(response.content.decode())
    assert not ApiToken.objects.exists()


def test_revoking_another_users_token_is_a_404(alice, bob):
    bobs, token = api_token_create(user=bob, name="bob's laptop")
    response = logged_in(alice).post(reverse("token-revoke", args=[bobs.pk]))
    assert response.status_code == 404
    bobs.refresh_from_db()
    assert bobs.revoked_at is None
    assert get_me(token).status_code == 200


def test_the_token_list_shows_status(alice, time_machine):
    api_token_create(user=alice, name="live")
    api_token_create(user=alice, name="short", expires_at=timezone.now() + timedelta(days=1))
    time_machine.move_to(timezone.now() + timedelta(days=2))
    statuses = {token.name: status for token, status in logged_in(alice).get(PROFILE).context["tokens"]}
    assert statuses == {"live": "active", "short": "expired"}
