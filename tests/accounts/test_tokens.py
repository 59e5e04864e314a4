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
