from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone
from rest_framework.test import APIClient

from accounts.models import ApiToken
from accounts.services import api_token_create, api_token_revoke, hash_token


def get_me(token: str):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client.get("/api/v1/me/")


def test_a_token_is_stored_hashed_and_works(alice):
    record, token = api_token_create(user=alice, name="laptop")
    assert token.startswith("gpb_")
    assert record.key_hash == hash_token(token)
    assert token not in str(ApiToken.objects.values_list())
    response = get_me(token)
    assert response.status_code == 200
    assert response.json()["username"] == "alice"
    record.refresh_from_db()
    assert record.last_used_at is not None


def test_a_revoked_token_is_refused(alice):
    record, token = api_token_create(user=alice, name="laptop")
    api_token_revoke(token=record, actor=alice)
    response = get_me(token)
    assert response.status_code == 401
    assert response.json()["error"] == {
        "code": "authentication_failed",
        "message": "Unknown or revoked API token.",
        "details": {},
    }


def test_an_expired_token_is_refused(alice, time_machine):
    _, token = api_token_create(user=alice, name="ci", expires_at=timezone.now() + timedelta(days=1))
    time_machine.move_to(timezone.now() + timedelta(days=2))
    assert get_me(token).json()["error"]["message"] == "This API token has expired: create a new one."


@pytest.mark.parametrize("header", ["Bearer", "Bearer a b", "Bearer gpb_wrong", "Token nope"])
def test_malformed_or_unknown_tokens_get_401(db, header):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=header)
    response = client.get("/api/v1/me/")
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "authentication_failed"


def test_a_disabled_account_token_is_refused(alice):
    _, token = api_token_create(user=alice, name="x")
    alice.is_active = False
    alice.save()
    assert get_me(token).json()["error"]["message"] == "This account is disabled."


def test_the_command_prints_only_the_token(alice):
    out = StringIO()
    call_command("create_api_token", "alice", "--name", "cron", stdout=out)
    token = out.getvalue().strip()
    assert token.startswith("gpb_") and "\n" not in token
    assert ApiToken.objects.get(key_hash=hash_token(token)).name == "cron"
    assert get_me(token).status_code == 200


def test_the_command_refuses_an_unknown_user(db):
    with pytest.raises(CommandError, match="No user named 'zoe'"):
        call_command("create_api_token", "zoe")


def test_tokens_over_the_api_are_shown_once_listed_and_revocable(alice, bob):
    from tests.api_helpers import client_for

    client = client_for(alice)
    created = client.post("/api/v1/tokens/", {"name": "cluster job"}, format="json")
    assert created.status_code == 201
    token = created.json()["token"]
    assert get_me(token).status_code == 200

    listed = client.get("/api/v1/tokens/").json()["results"]
    assert {t["name"] for t in listed} == {"tests", "cluster job"}
    assert all("token" not in t for t in listed)

    # Bob cannot see or revoke Alice's tokens.
    assert client_for(bob).get("/api/v1/tokens/").json()["count"] == 1
    assert client_for(bob).post(f"/api/v1/tokens/{created.json()['id']}/revoke/").status_code == 404

    assert client.post(f"/api/v1/tokens/{created.json()['id']}/revoke/").json()["revoked_at"] is not None
    assert get_me(token).status_code == 401


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "name"),
        ({"name": ""}, "name"),
        ({"name": "x", "expires_at": "2000-01-01T00:00:00Z"}, "expires_at"),
        ({"name": "x", "expires_at": "2100-01-01T00:00:00"}, "expires_at"),
    ],
)
def test_bad_token_requests_are_400(alice, body, field):
    from tests.api_helpers import client_for

    response = client_for(alice).post("/api/v1/tokens/", body, format="json")
    assert response.status_code == 400
    assert field in response.json()["error"]["details"]["fields"]
    assert ApiToken.objects.filter(user=alice).count() == 1
