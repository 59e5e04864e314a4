"""Failed API tokens are throttled per client address (accounts/throttling.py), counted in Redis."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client, override_settings

from accounts.services import api_token_create, api_token_revoke
from kernel.redis_client import redis_client

ME = "/api/v1/me/"
WRONG = "gpb_" + "x" * 40


@pytest.fixture
def token(alice) -> str:
    return api_token_create(user=alice, name="script")[1]


def get(token: str, address: str = "198.51.100.1", **headers: str):
    return Client(REMOTE_ADDR=address).get(ME, HTTP_AUTHORIZATION=f"Bearer {token}", **headers)


def test_twenty_failed_tokens_in_a_minute_get_the_address_a_429_with_retry_after(clock, token):
    for _ in range(20):
        assert get(WRONG).status_code == 401

    refused = get(token)  # even the right token: the answer must not tell a guess apart

    assert refused.status_code == 429
    assert refused["Retry-After"] == "60"  # the clock stands at 09:00:00, the start of a minute
    error = refused.json()["error"]
    assert error["code"] == "throttled"
    assert error["message"].startswith("Too many failed API tokens from your address.")


def test_the_address_may_try_again_in_the_next_minute(clock, token):
    for _ in range(20):
        get(WRONG)
    clock.shift(timedelta(seconds=45))
    assert get(token)["Retry-After"] == "15"
    clock.shift(timedelta(seconds=15))
    assert get(token).status_code == 200


def test_fewer_failures_than_the_limit_and_other_addresses_are_not_held_up(clock, token):
    for _ in range(19):
        get(WRONG)
    assert get(token).status_code == 200
    get(WRONG)
    assert get(token).status_code == 429
    assert get(token, address="198.51.100.2").status_code == 200


def test_malformed_headers_expired_and_revoked_tokens_count_as_failures(clock, alice, token):
    record, revoked = api_token_create(user=alice, name="old")
    api_token_revoke(token=record, actor=alice)
    for _ in range(10):
        assert get(revoked).status_code == 401
    for _ in range(10):
        malformed = Client(REMOTE_ADDR="198.51.100.1").get(ME, HTTP_AUTHORIZATION="Bearer two words")
        assert malformed.status_code == 401
    assert get(token).status_code == 429


def test_a_browser_session_is_not_throttled_by_the_token_failures_of_its_address(clock, alice, token):
    for _ in range(20):
        get(WRONG)
    browser = Client(REMOTE_ADDR="198.51.100.1")
    browser.force_login(alice)
    assert browser.get(ME).status_code == 200


def test_with_redis_away_tokens_are_still_checked_and_nothing_answers_500(clock, token, caplog):
    redis_client.cache_clear()
    try:
        with override_settings(REDIS_URL="redis://127.0.0.1:1/0"):
            assert get(WRONG).status_code == 401
            assert get(token).status_code == 200
    finally:
        redis_client.cache_clear()
    assert "API token failure not counted" in caplog.text
